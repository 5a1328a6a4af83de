//! Restart without a gap: a running driver hands its listening sockets to its successor over
//! a Unix control socket (`--handover PATH`), then drains as on SIGTERM. While the two overlap
//! both hold the same sockets, so a connection waiting in the kernel's accept queue is served
//! by one or the other and none is refused or reset.
//!
//! The exchange on the control socket, each message ending with an empty line: the running
//! process (the predecessor) sends the protocol line, its command, its pid and one line per
//! socket (address and role), the sockets attached; the successor starts serving on them and
//! answers `serving`; the predecessor answers `draining` and stops. The successor then owns
//! the path and offers its own sockets there to the next one. Only a process of the same user
//! is served; anyone else is refused.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::fd_passing::{self, MAX_FDS};

const PROTOCOL: &str = "switchyard-handover 1";
/// How long each side waits for the other's next message.
const EXCHANGE_WAIT: Duration = Duration::from_secs(30);
/// The largest message either side accepts.
const MAX_MESSAGE: usize = 16 * 1024;

/// Sockets received from a predecessor, until this process serves on them.
pub(crate) struct Takeover {
    path: PathBuf,
    control: UnixStream,
    pid: String,
    sockets: Vec<(String, std::net::TcpListener)>,
}

impl Takeover {
    /// Connects to the process offering its sockets at `path` and receives them. `None` when
    /// no process listens there (no socket file, or one left by a process that has stopped):
    /// the caller binds its listeners itself.
    pub async fn connect(path: &Path, command: &str) -> Result<Option<Takeover>, String> {
        let shown = path.display();
        refuse_non_socket(path)?;
        let mut control = match UnixStream::connect(path).await {
            Ok(control) => control,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) =>
            {
                tracing::info!(
                    "no process offers its listeners at {shown} ({e}); binding them afresh"
                );
                return Ok(None);
            }
            Err(e) => {
                return Err(format!(
                    "cannot connect to the hand-over socket {shown}: {e}"
                ))
            }
        };
        let mut fds = Vec::new();
        let header = tokio::time::timeout(EXCHANGE_WAIT, read_message(&mut control, &mut fds))
            .await
            .map_err(|_| {
                format!(
                    "the process at {shown} sent no listeners within {} s",
                    EXCHANGE_WAIT.as_secs()
                )
            })?
            .map_err(|e| format!("hand-over socket {shown}: {e}"))?;
        let (pid, addresses) =
            parse_header(&header, command).map_err(|e| format!("hand-over socket {shown}: {e}"))?;
        if addresses.len() != fds.len() {
            return Err(format!(
                "hand-over socket {shown}: {} sockets named but {} received",
                addresses.len(),
                fds.len()
            ));
        }
        let sockets: Vec<(String, std::net::TcpListener)> = addresses
            .into_iter()
            .zip(fds)
            .map(|(role, fd)| (role, std::net::TcpListener::from(fd)))
            .collect();
        let names: Vec<String> = sockets
            .iter()
            .map(|(role, socket)| format!("{role} {}", shown_address(socket)))
            .collect();
        tracing::info!(
            "taking over from process {pid} at {shown}: {}",
            names.join(", ")
        );
        Ok(Some(Takeover {
            path: path.to_path_buf(),
            control,
            pid,
            sockets,
        }))
    }

    /// The predecessor's socket for `role`, when it listens on `addr`.
    pub fn claim(&mut self, role: &str, addr: SocketAddr) -> Result<Option<TcpListener>, String> {
        let Some(index) = self.sockets.iter().position(|(r, _)| r == role) else {
            return Ok(None);
        };
        let listening = self.sockets[index].1.local_addr().ok();
        if addr.port() == 0 || listening != Some(addr) {
            tracing::info!(
                "the predecessor's {role} socket is on {}, this process listens on {addr}: \
                 binding it afresh",
                shown_address(&self.sockets[index].1)
            );
            return Ok(None);
        }
        let (_, socket) = self.sockets.swap_remove(index);
        socket
            .set_nonblocking(true)
            .and_then(|()| TcpListener::from_std(socket))
            .map(Some)
            .map_err(|e| format!("cannot serve the {role} socket taken over on {addr}: {e}"))
    }

    /// Tells the predecessor this process serves on the sockets; it then drains and exits.
    /// Sockets not claimed are closed here.
    pub async fn finish(mut self) {
        let shown = self.path.display().to_string();
        let pid = self.pid.clone();
        let answer = tokio::time::timeout(EXCHANGE_WAIT, async {
            write_message(&mut self.control, "serving", &[]).await?;
            read_message(&mut self.control, &mut Vec::new()).await
        })
        .await;
        match answer {
            Ok(Ok(text)) if text == "draining" => {
                tracing::info!("serving; process {pid} handed its listeners over and drains")
            }
            Ok(Ok(text)) => tracing::warn!(
                "process {pid} at {shown} answered '{text}' instead of draining; it may still \
                 be serving"
            ),
            Ok(Err(e)) => tracing::warn!(
                "process {pid} at {shown} did not confirm its drain ({e}); it may still be serving"
            ),
            Err(_) => tracing::warn!(
                "process {pid} at {shown} did not confirm its drain within {} s",
                EXCHANGE_WAIT.as_secs()
            ),
        }
    }
}

/// This process's sockets, offered at a path to a successor until the drain starts.
pub(crate) struct Offer {
    path: PathBuf,
    /// Device and inode of the socket file this process bound, to remove only its own.
    file: (u64, u64),
    task: JoinHandle<()>,
    taken: oneshot::Receiver<String>,
    handed_over: bool,
}

impl Offer {
    /// Listens at `path` (replacing a socket file already there) and hands `listeners`,
    /// named by role, to the first process of the same user that asks.
    pub fn start(
        path: &Path,
        command: &str,
        listeners: &[(&str, &TcpListener)],
    ) -> Result<Offer, String> {
        let shown = path.display();
        assert!(
            listeners.len() <= MAX_FDS,
            "too many listeners to hand over"
        );
        let mut header = format!(
            "{PROTOCOL}\ncommand {command}\npid {}\n",
            std::process::id()
        );
        let mut sockets = Vec::new();
        for (role, listener) in listeners {
            let addr = listener
                .local_addr()
                .map_err(|e| format!("the {role} listener has no address: {e}"))?;
            let copy = listener
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| format!("cannot keep the {role} socket for a hand-over: {e}"))?;
            header.push_str(&format!("socket {addr} {role}\n"));
            sockets.push(copy);
        }
        refuse_non_socket(path)?;
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot replace the hand-over socket {shown}: {e}")),
        }
        let control = UnixListener::bind(path)
            .map_err(|e| format!("cannot listen for hand-overs at {shown}: {e}"))?;
        let meta = std::fs::metadata(path)
            .map_err(|e| format!("cannot read the hand-over socket {shown}: {e}"))?;
        let (sender, taken) = oneshot::channel();
        let task = tokio::spawn(offer(control, header, sockets, sender));
        tracing::info!("offering the listeners to a successor at {shown}");
        Ok(Offer {
            path: path.to_path_buf(),
            file: (meta.dev(), meta.ino()),
            task,
            taken,
            handed_over: false,
        })
    }

    /// Resolves with the successor's pid once one serves on the sockets.
    pub async fn taken(&mut self) -> String {
        match (&mut self.taken).await {
            Ok(pid) => {
                self.handed_over = true;
                pid
            }
            Err(_) => std::future::pending().await,
        }
    }

    /// Stops offering: closes this process's spare copies of the sockets (so that once its
    /// accept loops stop, a socket no successor took is closed) and, unless a successor took
    /// them, removes the socket file.
    pub async fn withdraw(self) {
        self.task.abort();
        let _ = self.task.await;
        if self.handed_over {
            return;
        }
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|meta| (meta.dev(), meta.ino()) == self.file);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Serves successors one at a time until one takes the sockets over.
async fn offer(
    control: UnixListener,
    header: String,
    sockets: Vec<OwnedFd>,
    taken: oneshot::Sender<String>,
) {
    // SAFETY: geteuid cannot fail.
    let user = unsafe { libc::geteuid() };
    loop {
        let mut stream = match control.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!("hand-over socket: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let peer = stream.peer_cred().ok();
        let pid = peer
            .and_then(|c| c.pid())
            .map_or_else(|| "?".to_string(), |pid| pid.to_string());
        if peer.is_none_or(|c| c.uid() != user) {
            tracing::warn!(
                "hand-over refused to process {pid}: it does not run as this process's user"
            );
            continue;
        }
        tracing::info!("process {pid} asks for the listeners; handing them over");
        let fds: Vec<BorrowedFd<'_>> = sockets.iter().map(AsFd::as_fd).collect();
        let exchange = async {
            write_message(&mut stream, &header, &fds).await?;
            let answer = read_message(&mut stream, &mut Vec::new()).await?;
            if answer != "serving" {
                return Err(io::Error::other(format!("it answered '{answer}'")));
            }
            write_message(&mut stream, "draining", &[]).await
        };
        match tokio::time::timeout(EXCHANGE_WAIT, exchange).await {
            Ok(Ok(())) => {
                tracing::info!("process {pid} serves on the listeners; this process drains");
                let _ = taken.send(pid);
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!("hand-over to process {pid} abandoned ({e}); still serving")
            }
            Err(_) => tracing::warn!(
                "hand-over to process {pid} abandoned: no answer within {} s; still serving",
                EXCHANGE_WAIT.as_secs()
            ),
        }
    }
}

/// A path that exists and is not a socket is never connected to nor replaced.
fn refuse_non_socket(path: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => Err(format!(
            "the hand-over path {} exists and is not a socket; choose another path",
            path.display()
        )),
        _ => Ok(()),
    }
}

/// The predecessor's pid and its sockets' roles, in the order the sockets came.
fn parse_header(text: &str, command: &str) -> Result<(String, Vec<String>), String> {
    let mut lines = text.lines();
    let protocol = lines.next().unwrap_or_default();
    if protocol != PROTOCOL {
        return Err(format!(
            "the process there speaks '{protocol}', this one '{PROTOCOL}'; stop it and start \
             this one afresh"
        ));
    }
    let (mut pid, mut roles) = (String::from("?"), Vec::new());
    for line in lines {
        match line.split_once(' ') {
            Some(("command", theirs)) if theirs != command => {
                return Err(format!(
                    "it belongs to `switchyard {theirs}`, not `switchyard {command}`"
                ))
            }
            Some(("pid", value)) => pid = value.to_string(),
            Some(("socket", rest)) => {
                let (_, role) = rest
                    .split_once(' ')
                    .ok_or_else(|| format!("malformed line '{line}'"))?;
                roles.push(role.to_string());
            }
            _ => {}
        }
    }
    Ok((pid, roles))
}

fn shown_address(socket: &std::net::TcpListener) -> String {
    socket
        .local_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string())
}

/// Sends `text` and the message end, `fds` attached.
async fn write_message(
    stream: &mut UnixStream,
    text: &str,
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    let message = format!("{text}\n\n");
    let bytes = message.as_bytes();
    let sent = loop {
        stream.writable().await?;
        match stream.try_io(Interest::WRITABLE, || {
            fd_passing::send(stream.as_fd(), bytes, fds)
        }) {
            Ok(sent) => break sent,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    stream.write_all(&bytes[sent..]).await
}

/// Reads one message (without its end), adding the descriptors that came with it to `fds`.
async fn read_message(stream: &mut UnixStream, fds: &mut Vec<OwnedFd>) -> io::Result<String> {
    let mut text = Vec::new();
    let mut buf = [0u8; 2048];
    while !text.ends_with(b"\n\n") {
        stream.readable().await?;
        match stream.try_io(Interest::READABLE, || {
            fd_passing::receive(stream.as_fd(), &mut buf, fds)
        }) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the other process closed the connection",
                ))
            }
            Ok(read) => text.extend_from_slice(&buf[..read]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
        if text.len() > MAX_MESSAGE {
            return Err(io::Error::other("message too long"));
        }
    }
    text.truncate(text.len() - 2);
    String::from_utf8(text).map_err(|_| io::Error::other("message is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_successor_takes_the_sockets_and_the_predecessor_hears_it() {
        let dir = std::env::temp_dir().join(format!("switchyard-handover-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("control.sock");

        assert!(Takeover::connect(&path, "serve")
            .await
            .expect("absent")
            .is_none());
        let api = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = api.local_addr().expect("address");
        let mut offer = Offer::start(&path, "serve", &[("API", &api)]).expect("offers");

        let refused = Takeover::connect(&path, "ext-proc")
            .await
            .err()
            .expect("refused");
        assert!(refused.contains("switchyard serve"), "{refused}");
        let mut takeover = Takeover::connect(&path, "serve")
            .await
            .expect("connects")
            .expect("someone offers");
        assert!(takeover.claim("metrics", addr).expect("claims").is_none());
        let inherited = takeover.claim("API", addr).expect("claims").expect("API");
        assert_eq!(inherited.local_addr().expect("address"), addr);
        // A connection queued before the hand-over is accepted by the successor.
        let _client = std::net::TcpStream::connect(addr).expect("connects");
        drop(api);
        inherited
            .accept()
            .await
            .expect("accepts the queued connection");
        takeover.finish().await;
        let pid = tokio::time::timeout(Duration::from_secs(5), offer.taken())
            .await
            .expect("hand-over seen");
        assert_eq!(pid, std::process::id().to_string());
        offer.withdraw().await;
        // After a hand-over the path belongs to the successor and stays.
        assert!(path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_regular_file_is_never_replaced() {
        let dir = std::env::temp_dir().join(format!("switchyard-notsock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("file");
        std::fs::write(&path, "x").expect("file");
        let error = refuse_non_socket(&path).expect_err("refused");
        assert!(error.contains("not a socket"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
