//! The handshake every connection starts with, before anything else may cross it:
//!
//! ```text
//! initiator                                   responder
//!   HELLO { nonce_i }             ──────────▶
//!                                 ◀──────────   CHALLENGE { nonce_r, proof_r }
//!   (checks proof_r; wrong → ERROR, close)
//!   AUTH { proof_i, intro }       ──────────▶
//!                                               (checks proof_i; wrong → ERROR, close)
//! ```
//!
//! The session id is the initiator's (HELLO's header); every later frame must carry it.
//! Each step has a deadline, so a client that connects and sends nothing costs its
//! responder one handshake deadline and nothing else.

use crate::auth::{prove, random_bytes, verify, Role, Secret};
use crate::error::NetError;
use crate::io::FrameConn;
use crate::wire::{
    self, clip_message, Auth, Challenge, ErrorBody, ErrorCode, FrameType, Hello, Intro,
};
use std::time::Instant;

/// Sends one ERROR frame (best effort: the connection closes after it anyway).
pub fn refuse<C: FrameConn>(conn: &mut C, code: ErrorCode, message: &str, deadline: Instant) {
    let body = ErrorBody {
        code,
        message: clip_message(message.to_owned()),
    };
    let _ = conn.send(FrameType::Error, &body, deadline);
}

/// Turns an ERROR frame into the error it reports.
pub fn refusal(body: &[u8]) -> NetError {
    match wire::decode_body::<ErrorBody>(FrameType::Error, body) {
        Ok(e) => match e.code {
            ErrorCode::Auth => NetError::Auth(format!("the peer refused: {}", e.message)),
            ErrorCode::Program => NetError::Program(e.message),
            _ => NetError::Refused(e.message),
        },
        Err(e) => NetError::Protocol(format!("an unreadable ERROR frame: {e}")),
    }
}

/// Expects a frame of type `kind` (an ERROR frame becomes its error); checks the
/// session.
///
/// # Errors
/// The peer refused, closed, timed out, or sent something else.
pub fn expect<C: FrameConn>(
    conn: &mut C,
    kind: FrameType,
    what: &str,
    deadline: Instant,
) -> Result<Vec<u8>, NetError> {
    let f = conn.recv(what, deadline)?;
    if f.header.kind == FrameType::Error {
        return Err(refusal(&f.body));
    }
    if f.header.kind != kind {
        return Err(NetError::Protocol(format!(
            "expected {kind:?} ({what}), got {:?}",
            f.header.kind
        )));
    }
    if conn.session() != 0 && f.header.session != conn.session() {
        return Err(NetError::Protocol(format!(
            "a frame of session {:#x} on session {:#x}",
            f.header.session,
            conn.session()
        )));
    }
    Ok(f.body)
}

/// The initiator's side: proves the secret, checks the responder's proof, and states
/// `intro`.
///
/// # Errors
/// [`NetError::Auth`] if the responder's proof is wrong (an ERROR frame was sent) or it
/// refused ours; any I/O or protocol error.
pub fn initiate<C: FrameConn>(
    conn: &mut C,
    secret: &Secret,
    intro: Intro,
    deadline: Instant,
) -> Result<(), NetError> {
    let mine = random_bytes::<32>()?;
    conn.send(FrameType::Hello, &Hello { nonce: mine }, deadline)?;
    let body = expect(
        conn,
        FrameType::Challenge,
        "the handshake's CHALLENGE",
        deadline,
    )?;
    let ch: Challenge = wire::decode_body(FrameType::Challenge, &body)?;
    if !verify(
        secret,
        Role::Responder,
        conn.session(),
        &mine,
        &ch.nonce,
        &ch.proof,
    ) {
        let msg = "the peer's proof of the shared secret is wrong: it does not hold the same secret (check both secret files)";
        refuse(conn, ErrorCode::Auth, msg, deadline);
        return Err(NetError::Auth(msg.into()));
    }
    let proof = prove(secret, Role::Initiator, conn.session(), &ch.nonce, &mine);
    conn.send(FrameType::Auth, &Auth { proof, intro }, deadline)
}

/// The responder's side: answers HELLO with its nonce and proof, checks the initiator's
/// proof, and returns the initiator's session id and intro. On a wrong proof it sends
/// one ERROR frame and returns the error (the caller closes the connection).
///
/// # Errors
/// [`NetError::Auth`]; a silent or slow initiator past `deadline`; any protocol error.
pub fn respond<C: FrameConn>(
    conn: &mut C,
    secret: &Secret,
    deadline: Instant,
) -> Result<Intro, NetError> {
    let f = conn.recv("the handshake's HELLO", deadline)?;
    if f.header.kind != FrameType::Hello {
        let msg = format!("expected HELLO first, got {:?}", f.header.kind);
        refuse(conn, ErrorCode::Protocol, &msg, deadline);
        return Err(NetError::Protocol(msg));
    }
    let hello: Hello = match wire::decode_body(FrameType::Hello, &f.body) {
        Ok(h) => h,
        Err(e) => {
            refuse(conn, ErrorCode::Protocol, &e.to_string(), deadline);
            return Err(e.into());
        }
    };
    conn.set_session(f.header.session);
    let mine = random_bytes::<32>()?;
    let proof = prove(secret, Role::Responder, conn.session(), &hello.nonce, &mine);
    conn.send(
        FrameType::Challenge,
        &Challenge { nonce: mine, proof },
        deadline,
    )?;
    let body = expect(conn, FrameType::Auth, "the handshake's AUTH", deadline)?;
    let auth: Auth = wire::decode_body(FrameType::Auth, &body)?;
    if !verify(
        secret,
        Role::Initiator,
        conn.session(),
        &mine,
        &hello.nonce,
        &auth.proof,
    ) {
        let msg = "wrong proof of the shared secret: the two ends use different secrets (check the secret files)";
        refuse(conn, ErrorCode::Auth, msg, deadline);
        return Err(NetError::Auth(msg.into()));
    }
    Ok(auth.intro)
}
