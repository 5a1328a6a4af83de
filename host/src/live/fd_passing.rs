//! Sending open file descriptors to another process over a Unix stream socket (`SCM_RIGHTS`
//! ancillary data), which the standard library offers only on nightly. The only unsafe code
//! of the hand-over lives here.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The most descriptors one message carries.
pub(crate) const MAX_FDS: usize = 8;

/// Room for one `SCM_RIGHTS` header with `MAX_FDS` descriptors, aligned for `cmsghdr`.
type ControlBuffer = [u64; 16];

fn control_space(fds: usize) -> usize {
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    let space = unsafe { libc::CMSG_SPACE((fds * size_of::<RawFd>()) as u32) } as usize;
    assert!(
        space <= size_of::<ControlBuffer>(),
        "{fds} descriptors do not fit"
    );
    space
}

/// Sends `data` on `socket` with `fds` attached; returns how many bytes of `data` went out
/// (the descriptors travel with the first of them).
pub(crate) fn send(
    socket: BorrowedFd<'_>,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    assert!(
        fds.len() <= MAX_FDS,
        "at most {MAX_FDS} descriptors at once"
    );
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let mut control: ControlBuffer = [0; 16];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data; zero is a valid value for every field.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    if !raw.is_empty() {
        let payload = std::mem::size_of_val(raw.as_slice());
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = control_space(raw.len()) as _;
        // SAFETY: the control buffer is aligned and large enough for one header carrying
        // `raw` (checked by control_space), so the first header and its data are in bounds.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&message);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(payload as u32) as _;
            std::ptr::copy_nonoverlapping(
                raw.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(header),
                payload,
            );
        }
    }
    // SAFETY: every pointer in `message` points into live buffers of the stated lengths.
    let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &message, 0) };
    if sent < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(sent as usize)
    }
}

/// Reads from `socket` into `buf`; descriptors that came along are added to `fds`, each
/// closed on exec. Returns the bytes read, 0 at the end of the stream.
pub(crate) fn receive(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    let mut control: ControlBuffer = [0; 16];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; zero is a valid value for every field.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = size_of::<ControlBuffer>() as _;
    // SAFETY: every pointer in `message` points into live buffers of the stated lengths.
    let read = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut message, 0) };
    if read < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel filled `control` with `msg_controllen` bytes of well-formed headers;
    // CMSG_NXTHDR stays within them, and each SCM_RIGHTS payload holds descriptors now ours.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&message);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(header).cast::<RawFd>();
                for i in 0..bytes / size_of::<RawFd>() {
                    let fd = OwnedFd::from_raw_fd(data.add(i).read_unaligned());
                    libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC);
                    fds.push(fd);
                }
            }
            header = libc::CMSG_NXTHDR(&message, header);
        }
    }
    if message.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other(format!(
            "more than {MAX_FDS} descriptors sent at once"
        )));
    }
    Ok(read as usize)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use super::*;

    #[test]
    fn descriptors_arrive_with_the_data_and_stay_usable() {
        let (left, right) = UnixStream::pair().expect("socket pair");
        let (mut pipe_reader, pipe_writer) = std::io::pipe().expect("pipe");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        let sent = send(
            left.as_fd(),
            b"two",
            &[pipe_writer.as_fd(), listener.as_fd()],
        )
        .expect("sends");
        assert_eq!(sent, 3);
        drop(pipe_writer);

        let mut buf = [0u8; 16];
        let mut fds = Vec::new();
        let read = receive(right.as_fd(), &mut buf, &mut fds).expect("receives");
        assert_eq!(&buf[..read], b"two");
        assert_eq!(fds.len(), 2);
        let mut fds = fds.into_iter();
        let mut writer = std::fs::File::from(fds.next().expect("pipe end"));
        writer.write_all(b"through").expect("writes");
        drop(writer);
        let mut text = String::new();
        pipe_reader.read_to_string(&mut text).expect("reads");
        assert_eq!(text, "through");
        let received = std::net::TcpListener::from(fds.next().expect("listener"));
        assert_eq!(
            received.local_addr().expect("address"),
            listener.local_addr().expect("address")
        );
    }

    #[test]
    fn plain_data_carries_no_descriptors() {
        let (left, right) = UnixStream::pair().expect("socket pair");
        assert_eq!(send(left.as_fd(), b"x", &[]).expect("sends"), 1);
        let mut buf = [0u8; 4];
        let mut fds = Vec::new();
        assert_eq!(
            receive(right.as_fd(), &mut buf, &mut fds).expect("receives"),
            1
        );
        assert!(fds.is_empty());
        drop(left);
        assert_eq!(receive(right.as_fd(), &mut buf, &mut fds).expect("end"), 0);
    }
}
