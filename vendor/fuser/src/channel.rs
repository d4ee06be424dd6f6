use std::io;
use std::os::fd::AsFd;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use nix::errno::Errno;

use crate::dev_fuse::DevFuse;
use crate::passthrough::BackingId;

/// A raw communication channel to the FUSE kernel driver
#[derive(Debug, Clone)]
pub(crate) struct Channel(Arc<DevFuse>);

impl AsFd for Channel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl Channel {
    /// Create a new communication channel to the kernel driver by mounting the
    /// given path. The kernel driver will delegate filesystem operations of
    /// the given path to the channel.
    pub(crate) fn new(device: Arc<DevFuse>) -> Self {
        Self(device)
    }

    /// Receives data up to the capacity of the given buffer (can block).
    fn receive(&self, buffer: &mut [u8]) -> nix::Result<usize> {
        nix::unistd::read(&self.0, buffer)
    }

    /// Receives data up to the capacity of the given buffer (can block),
    /// retrying on errors that are safe to retry (ENOENT, EINTR, EAGAIN).
    ///
    /// - ENOENT: Operation interrupted. According to FUSE, this is safe to retry.
    /// - EINTR: Interrupted system call, retry.
    /// - EAGAIN: Explicitly instructed to try again.
    pub(crate) fn receive_retrying(&self, buffer: &mut [u8]) -> nix::Result<usize> {
        loop {
            match self.receive(buffer) {
                Ok(size) => return Ok(size),
                Err(Errno::ENOENT | Errno::EINTR | Errno::EAGAIN) => continue,
                Err(err) => return Err(err),
            }
        }
    }

    /// Returns a sender object for this channel. The sender object can be
    /// used to send to the channel. Multiple sender objects can be used
    /// and they can safely be sent to other threads.
    pub(crate) fn sender(&self) -> ChannelSender {
        // Since write/writev syscalls are threadsafe, we can simply create
        // a sender by using the same file and use it in other threads.
        ChannelSender(self.0.clone(), None)
    }

    /// Clone the FUSE device fd using FUSE_DEV_IOC_CLONE ioctl.
    ///
    /// This creates a new fd that can read FUSE requests independently,
    /// enabling true parallel request processing. The kernel distributes
    /// requests across all cloned fds.
    ///
    /// Requires Linux 4.5+. Returns an error on older kernels or non-Linux.
    #[cfg(target_os = "linux")]
    pub(crate) fn clone_fd(&self) -> io::Result<Channel> {
        use std::os::fd::AsRawFd;

        let new_dev = DevFuse::open()?;

        let mut source_fd = self.0.as_raw_fd() as u32;
        // SAFETY: fuse_dev_ioc_clone is a valid ioctl for /dev/fuse
        unsafe {
            crate::ll::ioctl::fuse_dev_ioc_clone(new_dev.as_raw_fd(), &mut source_fd)?;
        }

        Ok(Channel::new(Arc::new(new_dev)))
    }
}

/// Where a reply to a request that came over io_uring goes (FerriteFS addition): the
/// out header into `hdr`, the body straight into the ring entry's payload buffer.
#[derive(Debug)]
pub(crate) struct ReplySlot {
    /// The entry's payload buffer, or null while no request is being served: a reply
    /// sent late (after its request was committed) is dropped, never written.
    pub(crate) body: *mut u8,
    pub(crate) cap: usize,
    /// Body bytes of the reply; `None` until one came, or when it did not fit.
    pub(crate) len: Option<usize>,
    pub(crate) hdr: [u8; 16],
}

// SAFETY: `body` is only written under the slot's mutex, and only while armed by the
// ring thread that owns the entry (see `uring`).
unsafe impl Send for ReplySlot {}

/// Sends replies and notifications to the kernel through `/dev/fuse`, or (FerriteFS
/// addition) puts a reply to a request that came over io_uring into its ring entry,
/// which the ring thread that dispatched the request then commits.
#[derive(Clone, Debug)]
pub(crate) struct ChannelSender(Arc<DevFuse>, Option<Arc<parking_lot::Mutex<ReplySlot>>>);

impl ChannelSender {
    /// A sender whose replies go into `slot` instead of `/dev/fuse`.
    #[cfg(target_os = "linux")]
    pub(crate) fn capturing(&self, slot: Arc<parking_lot::Mutex<ReplySlot>>) -> ChannelSender {
        ChannelSender(self.0.clone(), Some(slot))
    }

    pub(crate) fn send(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<()> {
        if let Some(slot) = &self.1 {
            let mut s = slot.lock();
            if s.body.is_null() {
                log::warn!("fuse-uring: a reply came after its request was answered");
                return Ok(());
            }
            let mut at = 0usize; // offset in the concatenated reply
            let mut len = 0usize;
            for b in bufs {
                let mut b: &[u8] = b;
                if at < 16 {
                    let n = b.len().min(16 - at);
                    s.hdr[at..at + n].copy_from_slice(&b[..n]);
                    at += n;
                    b = &b[n..];
                }
                if b.is_empty() {
                    continue;
                }
                if len + b.len() > s.cap {
                    s.len = None;
                    return Ok(());
                }
                // SAFETY: armed, `body` is the entry's payload buffer of `cap` bytes,
                // which only this ring thread touches until it commits the entry.
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), s.body.add(len), b.len()) };
                len += b.len();
                at += b.len();
            }
            s.len = Some(len);
            return Ok(());
        }
        let rc = nix::sys::uio::writev(&self.0, bufs)?;
        // writev is atomic, so do not need to check how many bytes are written.
        // libfuse does not do it either
        // https://github.com/libfuse/libfuse/blob/6278995cca991978abd25ebb2c20ebd3fc9e8a13/lib/fuse_lowlevel.c#L267
        debug_assert_eq!(bufs.iter().map(|b| b.len()).sum::<usize>(), rc);
        Ok(())
    }

    pub(crate) fn open_backing(&self, fd: BorrowedFd<'_>) -> std::io::Result<BackingId> {
        BackingId::create(&self.0, fd)
    }

    pub(crate) unsafe fn wrap_backing(&self, id: u32) -> BackingId {
        unsafe { BackingId::wrap_raw(&self.0, id) }
    }
}
