//! Bounds on the request body bytes that wait for a slot.
//!
//! A request reads the first bytes of its body before it takes an instance slot
//! (up to [`buffer_before_slot`](crate::RuntimeConfig::buffer_before_slot), see
//! [`crate::instances::slow_client`]), so a slow client holds no instance while
//! it trickles in. Those bytes are held in memory until the slot is taken. One
//! request holds at most that much, but an HTTP/2 connection carries many
//! requests at once, and a listener many connections: without a bound of their
//! own, a client opening every stream it may and sending a little of each body
//! holds memory the node's other limits do not see.
//!
//! So a front door puts a [`PreSlotBudget`] in each request's extensions:
//! the byte budgets of its connection and of its listener. Every body byte
//! the request buffers before its slot is charged to each of them, and
//! given back as soon as the slot is taken or the request ends. A request
//! whose next bytes would pass a budget is refused at once with a 503
//! ([`crate::RuntimeError::PreSlotFull`]); the requests already holding
//! bytes, and every other connection's, go on. A request without a budget
//! (a nested call, one forwarded by a peer) is charged to none.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use crate::body::{Body, BoxError};

/// Bytes that requests may hold before their slots, over one scope (a
/// connection, a listener). Shared by the requests it covers.
#[derive(Debug)]
pub struct ByteBudget {
    used: AtomicUsize,
    cap: usize,
    scope: &'static str,
}

impl ByteBudget {
    /// A budget of `cap` bytes over `scope` (named in the refusal: "this
    /// connection", "this node").
    pub fn new(cap: usize, scope: &'static str) -> Arc<Self> {
        Arc::new(ByteBudget {
            used: AtomicUsize::new(0),
            cap,
            scope,
        })
    }

    /// Bytes charged to it now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn try_take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|&t| t <= self.cap)
            })
            .is_ok()
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// The budgets a request's pre-slot bytes are charged to, innermost first;
/// a request extension set by the front door.
#[derive(Debug, Clone)]
pub struct PreSlotBudget {
    budgets: Vec<Arc<ByteBudget>>,
}

impl PreSlotBudget {
    /// Charges to every one of `budgets`.
    pub fn new(budgets: Vec<Arc<ByteBudget>>) -> Self {
        PreSlotBudget { budgets }
    }

    /// Takes `n` bytes from every budget, or from none: the first budget
    /// that cannot give them, if one cannot.
    fn take(&self, n: usize) -> Result<(), &ByteBudget> {
        for (i, b) in self.budgets.iter().enumerate() {
            if !b.try_take(n) {
                for taken in &self.budgets[..i] {
                    taken.give(n);
                }
                return Err(b);
            }
        }
        Ok(())
    }

    fn give(&self, n: usize) {
        for b in &self.budgets {
            b.give(n);
        }
    }

    /// Takes `n` bytes from every budget for as long as the returned
    /// [`Reservation`] lives, or from none. For memory a connection holds
    /// on its requests' behalf whatever they read: an HTTP/2 connection's
    /// receive window, which a client may fill before any request body is
    /// read.
    pub fn reserve(&self, n: usize) -> Result<Reservation, OverBudget> {
        self.take(n).map_err(|b| OverBudget {
            scope: b.scope,
            cap: b.cap,
        })?;
        Ok(Reservation {
            budget: self.clone(),
            bytes: n,
        })
    }
}

/// Bytes held of a [`PreSlotBudget`] until dropped ([`PreSlotBudget::reserve`]).
#[derive(Debug)]
pub struct Reservation {
    budget: PreSlotBudget,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give(self.bytes);
    }
}

/// A request's next body bytes would pass one of its budgets.
#[derive(Debug, thiserror::Error)]
#[error("{scope} already holds {cap} bytes of request bodies waiting for a slot")]
pub struct OverBudget {
    /// The budget's scope ("this connection", "this node").
    pub scope: &'static str,
    /// Its size in bytes.
    pub cap: usize,
}

/// What one request holds of its budgets: charged as its body arrives,
/// given back when it [`settle`](Charge::settle)s (takes its slot) or is
/// dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    budget: PreSlotBudget,
    state: Mutex<(usize, bool)>,
}

impl Charge {
    fn add(&self, n: usize) -> Result<(), OverBudget> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.1 || n == 0 {
            return Ok(());
        }
        self.budget.take(n).map_err(|b| OverBudget {
            scope: b.scope,
            cap: b.cap,
        })?;
        s.0 += n;
        Ok(())
    }

    /// The request has its slot: its bytes are the instance's now. Gives
    /// them back and charges nothing more.
    pub(crate) fn settle(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !s.1 {
            self.budget.give(s.0);
            *s = (0, true);
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.settle();
    }
}

/// `body`, with every data byte it yields charged to `budget` until the
/// returned [`Charge`] settles; a frame that does not fit ends the body
/// with [`OverBudget`].
pub(crate) fn metered(body: Body, budget: PreSlotBudget) -> (Body, Arc<Charge>) {
    let charge = Arc::new(Charge {
        budget,
        state: Mutex::new((0, false)),
    });
    let body = Metered {
        inner: body,
        charge: charge.clone(),
    };
    (http_body_util::BodyExt::boxed_unsync(body), charge)
}

struct Metered {
    inner: Body,
    charge: Arc<Charge>,
}

impl HttpBody for Metered {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if let Some(Ok(f)) = &frame
            && let Some(d) = f.data_ref()
            && let Err(e) = self.charge.add(d.len())
        {
            return Poll::Ready(Some(Err(Box::new(e))));
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_is_all_or_nothing_and_given_back_once() {
        let conn = ByteBudget::new(100, "this connection");
        let node = ByteBudget::new(150, "this node");
        let budget = PreSlotBudget::new(vec![conn.clone(), node.clone()]);
        let a = Charge {
            budget: budget.clone(),
            state: Mutex::new((0, false)),
        };
        a.add(60).expect("fits");
        let err = a.add(60).expect_err("over the connection's 100");
        assert_eq!(err.scope, "this connection");
        assert_eq!((conn.used(), node.used()), (60, 60), "nothing half-taken");
        let other = PreSlotBudget::new(vec![ByteBudget::new(100, "other"), node.clone()]);
        let b = Charge {
            budget: other,
            state: Mutex::new((0, false)),
        };
        let err = b.add(100).expect_err("over the listener's 150");
        assert_eq!(err.scope, "this node");
        a.settle();
        assert_eq!((conn.used(), node.used()), (0, 0));
        a.add(10).expect("settled: charged to nothing");
        drop(a);
        assert_eq!((conn.used(), node.used()), (0, 0), "not given back twice");
        b.add(100).expect("room again");
        drop(b);
        assert_eq!(node.used(), 0, "a dropped request gives its bytes back");
    }

    #[test]
    fn a_reservation_holds_its_bytes_until_dropped_and_leaves_less_for_bodies() {
        let conn = ByteBudget::new(100, "this connection");
        let node = ByteBudget::new(150, "this node");
        let budget = PreSlotBudget::new(vec![conn.clone(), node.clone()]);
        let window = budget.reserve(64).expect("fits");
        assert_eq!((conn.used(), node.used()), (64, 64));
        let body = Charge {
            budget: budget.clone(),
            state: Mutex::new((0, false)),
        };
        let err = body
            .add(40)
            .expect_err("64 + 40 is over the connection's 100");
        assert_eq!(err.scope, "this connection");
        let other = PreSlotBudget::new(vec![ByteBudget::new(100, "other"), node.clone()]);
        let err = other
            .reserve(100)
            .expect_err("64 + 100 is over the node's 150");
        assert_eq!(err.scope, "this node");
        assert_eq!(node.used(), 64, "a refused reservation takes nothing");
        drop(window);
        assert_eq!((conn.used(), node.used()), (0, 0));
        body.add(40).expect("room again");
    }
}
