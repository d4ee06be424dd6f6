//! Messages between a daemon and its clients: one message per packet of a Unix
//! SOCK_SEQPACKET connection, little-endian, a 4-byte kind then a body; descriptors
//! travel as SCM_RIGHTS.
//!
//! | kind | from | body | descriptors |
//! |---|---|---|---|
//! | HELLO | client | version u32, pid u32 | the pool file, opened read-write (the proof that this process may map it) |
//! | WELCOME | daemon | party u32, 0 u32, ninodes u64, nblocks u64, uuid 16 bytes | the table memfd |
//! | REFUSE | daemon | errno i32, message | |
//! | GRANT | client | blocks wanted u64 | |
//! | GRANTED | daemon | runs | |
//! | RETURN | client | runs | |
//! | BYE | client | | |
//!
//! Runs are a count u32 and that many (first block u64, length u64). A client waits
//! for an answer only to HELLO and GRANT; the daemon answers nothing else.

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{OwnedFd, RawFd};

/// Protocol version.
pub const VERSION: u32 = 1;
/// Message kinds.
pub const HELLO: u32 = 1;
/// Daemon: attached.
pub const WELCOME: u32 = 2;
/// Daemon: no.
pub const REFUSE: u32 = 3;
/// Client: blocks please.
pub const GRANT: u32 = 4;
/// Daemon: here.
pub const GRANTED: u32 = 5;
/// Client: blocks back.
pub const RETURN: u32 = 6;
/// Client: detaching.
pub const BYE: u32 = 8;
/// Largest message.
pub const MAX_MSG: usize = 1 << 16;
/// Most runs in one message.
pub const MAX_RUNS: usize = (MAX_MSG - 8) / 16;

/// A received message.
pub struct Msg {
    /// Kind.
    pub kind: u32,
    /// Body.
    pub body: Vec<u8>,
    /// Descriptors that came with it.
    pub fds: Vec<OwnedFd>,
}

/// Send one message. `dontwait`: fail with WouldBlock instead of waiting.
pub fn send(fd: RawFd, kind: u32, body: &[u8], fds: &[RawFd], dontwait: bool) -> io::Result<()> {
    assert!(body.len() + 4 <= MAX_MSG, "message too large");
    let k = kind.to_le_bytes();
    let iov = [IoSlice::new(&k), IoSlice::new(body)];
    let cm = [ControlMessage::ScmRights(fds)];
    let cms: &[ControlMessage] = if fds.is_empty() { &[] } else { &cm };
    let mut flags = MsgFlags::MSG_NOSIGNAL;
    if dontwait {
        flags |= MsgFlags::MSG_DONTWAIT;
    }
    loop {
        match sendmsg::<()>(fd, &iov, cms, flags, None) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(io::Error::from(e)),
        }
    }
}

/// Receive one message; `None` when the peer closed the connection.
///
/// The packet's length is peeked first (`MSG_PEEK | MSG_TRUNC` returns it whole and,
/// with no control buffer, takes no descriptors), then it is read into a buffer of
/// that size. A buffer of [`MAX_MSG`] per message, zeroed, was most of a client's
/// HELLO round trip: 16 fresh pages faulted in and cleared in every new process
/// (about 90 us of its attach on the development VM, estimated from perf's share
/// of its samples), and the same in each daemon
/// thread that serves one.
pub fn recv(fd: RawFd) -> io::Result<Option<Msg>> {
    let mut cmsg = nix::cmsg_space!([RawFd; 4]);
    loop {
        let peek = MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC;
        let n = match recvmsg::<()>(fd, &mut [] as &mut [IoSliceMut<'_>], None, peek) {
            Ok(m) => m.bytes,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(io::Error::from(e)),
        };
        if n == 0 {
            // End of the connection (SOCK_SEQPACKET has no empty messages here:
            // every one carries its kind). Consume it like any other read would.
            return Ok(None);
        }
        if n > MAX_MSG {
            return Err(io::Error::other(format!("message of {n} bytes (at most {MAX_MSG})")));
        }
        let mut buf = vec![0u8; n];
        let mut iov = [IoSliceMut::new(&mut buf)];
        let r = recvmsg::<()>(fd, &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC);
        let m = match r {
            Ok(m) => m,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(io::Error::from(e)),
        };
        let mut fds = Vec::new();
        for c in m.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(v) = c {
                fds.extend(v.into_iter().map(crate::own_fd));
            }
        }
        if m.bytes != n {
            // One reader per connection (the client's asks are serialised; the
            // daemon's thread is the only reader of its end): the packet peeked is
            // the packet read.
            return Err(io::Error::other("message changed between peek and read"));
        }
        if n < 4 {
            return Err(io::Error::other("short message"));
        }
        let kind = u32::from_le_bytes(buf[..4].try_into().expect("4 bytes"));
        buf.drain(..4);
        return Ok(Some(Msg { kind, body: buf, fds }));
    }
}

/// Little-endian writer.
#[derive(Default)]
pub struct Out(pub Vec<u8>);

impl Out {
    /// Append a u32.
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Append a u64.
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Append bytes.
    pub fn bytes(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    /// Append runs.
    pub fn runs(mut self, runs: &[(u64, u64)]) -> Self {
        assert!(runs.len() <= MAX_RUNS);
        self = self.u32(runs.len() as u32);
        for &(b, n) in runs {
            self = self.u64(b).u64(n);
        }
        self
    }
}

/// Little-endian reader; every read is bounds-checked (bodies come from another
/// process).
pub struct In<'a> {
    b: &'a [u8],
    o: usize,
}

impl<'a> In<'a> {
    /// Read `b`.
    pub fn new(b: &'a [u8]) -> Self {
        In { b, o: 0 }
    }
    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        let s =
            self.b.get(self.o..self.o + n).ok_or_else(|| io::Error::other("short message body"))?;
        self.o += n;
        Ok(s)
    }
    /// A u32.
    pub fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    /// A u64.
    pub fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    /// `n` bytes.
    pub fn bytes(&mut self, n: usize) -> io::Result<&'a [u8]> {
        self.take(n)
    }
    /// The rest.
    pub fn rest(&mut self) -> &'a [u8] {
        let r = &self.b[self.o.min(self.b.len())..];
        self.o = self.b.len();
        r
    }
    /// Runs.
    pub fn runs(&mut self) -> io::Result<Vec<(u64, u64)>> {
        let n = self.u32()? as usize;
        if n > MAX_RUNS {
            return Err(io::Error::other("too many runs"));
        }
        (0..n).map(|_| Ok((self.u64()?, self.u64()?))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    use std::os::fd::AsRawFd;

    /// The tests count the process's descriptors: one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn pair() -> (OwnedFd, OwnedFd) {
        socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
            .expect("socketpair")
    }

    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count()
    }

    /// Each message arrives whole at its own size, from an empty body to the
    /// largest, with its descriptors; the end of the connection is `None`.
    #[test]
    fn each_message_arrives_whole_with_its_descriptors() {
        let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let (a, b) = pair();
        let file = std::fs::File::open("/proc/self/stat").expect("a file to pass");
        for (i, len) in [0usize, 1, 3, 100, 4093, MAX_MSG - 4].into_iter().enumerate() {
            let body: Vec<u8> = (0..len).map(|j| (j * 7 + i) as u8).collect();
            let fds = if i % 2 == 0 { vec![file.as_raw_fd()] } else { vec![] };
            send(a.as_raw_fd(), 10 + i as u32, &body, &fds, false).expect("send");
            let m = recv(b.as_raw_fd()).expect("recv").expect("a message");
            assert_eq!(m.kind, 10 + i as u32, "kind of message {i}");
            assert!(m.body == body, "body of message {i} ({len} bytes)");
            assert_eq!(m.fds.len(), fds.len(), "descriptors of message {i}");
        }
        drop(a);
        assert!(recv(b.as_raw_fd()).expect("recv at the end").is_none());
    }

    /// The length is peeked without a control buffer: a message's descriptors are
    /// installed once, by the read, never by the peek (a peek with one would dup
    /// them into the process, one leak per message).
    #[test]
    fn a_peek_installs_no_descriptor() {
        let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let (a, b) = pair();
        let file = std::fs::File::open("/proc/self/stat").expect("a file to pass");
        let before = open_fds();
        for _ in 0..50 {
            send(a.as_raw_fd(), 1, b"x", &[file.as_raw_fd()], false).expect("send");
            let m = recv(b.as_raw_fd()).expect("recv").expect("a message");
            assert_eq!(m.fds.len(), 1);
        }
        // The 50 received descriptors were dropped with their messages (a margin for
        // the crate's other tests, which may hold a few meanwhile; a leak is 50).
        let after = open_fds();
        assert!(after < before + 10, "{before} descriptors open before 50 messages, {after} after");
    }
}
