//! Naming the plugin that ends the process.
//!
//! A plugin runs inside the host, so a library that calls `process::exit`, aborts, or
//! overflows its stack ends switchyard and nothing can stop it. What the host can do is say
//! which plugin it was calling: before each call it notes the plugin and the entry point in a
//! thread-local slot, and an exit hook and a `SIGABRT` handler print that note when the
//! process ends while a call is under way. A stack overflow ends in an abort, so it is named
//! too; a fault the runtime does not turn into an abort (a wild pointer) is not.

use std::cell::Cell;
use std::sync::Once;

thread_local! {
    /// The plugin being called on this thread: its label's bytes and the entry point.
    static CURRENT: Cell<(*const u8, usize, &'static str)> =
        const { Cell::new((std::ptr::null(), 0, "")) };
}

/// Marks a plugin call as under way until dropped.
pub struct InCall {
    previous: (*const u8, usize, &'static str),
}

impl Drop for InCall {
    #[inline]
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.previous));
    }
}

/// Notes that `label` is being called at `entry` until the result is dropped. `label` must
/// outlive the call (it is read only while the call is under way).
#[inline]
pub fn enter(label: &str, entry: &'static str) -> InCall {
    let previous = CURRENT.with(|c| c.replace((label.as_ptr(), label.len(), entry)));
    InCall { previous }
}

/// Installs the exit hook and the abort handler, once per process.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registering a plain `extern "C"` function with no captured state; the
        // handler only reads a thread-local `Cell` of plain values and calls `write`, both
        // async-signal-safe, then restores the default action and re-raises.
        unsafe {
            libc::atexit(on_exit);
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_abort as extern "C" fn(libc::c_int) as *const () as usize;
            action.sa_flags = libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGABRT, &action, std::ptr::null_mut());
        }
    });
}

extern "C" fn on_exit() {
    report("exited");
}

extern "C" fn on_abort(_signal: libc::c_int) {
    report("aborted");
    // SAFETY: restoring the default action and re-raising ends the process as an abort would.
    unsafe {
        libc::signal(libc::SIGABRT, libc::SIG_DFL);
        libc::raise(libc::SIGABRT);
    }
}

/// Writes the note to standard error without allocating (this may run in a signal handler).
fn report(how: &str) {
    let Ok((label, len, entry)) = CURRENT.try_with(Cell::get) else {
        return;
    };
    if label.is_null() {
        return;
    }
    // SAFETY: the slot is set only for the duration of a call, from a `&str` that outlives
    // the call; the process is ending inside that call.
    let label = unsafe { std::slice::from_raw_parts(label, len) };
    let parts: [&[u8]; 7] = [
        b"switchyard: the process ",
        how.as_bytes(),
        b" inside a call to plugin '",
        label,
        b"' (",
        entry.as_bytes(),
        b"); a plugin that exits, aborts or overflows its stack cannot be contained (docs/plugin-abi.md)\n",
    ];
    for part in parts {
        // SAFETY: writing a valid buffer to file descriptor 2.
        unsafe {
            libc::write(2, part.as_ptr().cast(), part.len());
        }
    }
}
