//! Where a request is served: the routing decision, as a pure function.
//!
//! A request for Worker `S` arrives at node `N`. Every Worker has a *home* on
//! the hash ring. The policy (the article's "routing requests to where
//! Workers already exist") is:
//!
//! 1. `S` is warm on `N` → serve it here ([`Route::Local`]). A warm instance
//!    costs nothing more to use, and a Worker busy enough to be warm on
//!    several nodes must keep scaling horizontally.
//! 2. `N` is `S`'s home → serve it here, cold-starting if needed
//!    ([`Route::Home`]).
//! 3. Otherwise → forward to the home `H` ([`Decision::Forward`]). What the
//!    home answers settles the route: served by `H` ([`Route::Sharded`]), or
//!    refused by / unreachable at `H` and served here ([`Route::Fallback`]),
//!    see [`after_forward`].
//!
//! The [`Route`] is the *role* a request is served in. It is decided once,
//! here, and travels with the request to the node that runs the Worker
//! ([`crate::hosted_workers::HostedWorkers::serve`] takes it): the receiving
//! node serves `local` or `home` itself; a home serves what reaches it over
//! the hop as `sharded`; a request the home refused, or that could not
//! reach it, is served back on the receiving node as `fallback`. The serving
//! node alone stamps the route into the [`ROUTE_HEADER`] response header
//! and counts it in its metrics, so each request is counted once, by the
//! node that ran it.
//!
//! # Durable Objects
//!
//! A Durable Object is routed by its *ring key* (`do:<script>/<class>/<id>`,
//! [`is_object_key`]) and has stricter rules, because there must be at
//! most one live instance of it in the cluster ([`decide_object`]):
//!
//! * its home on the ring serves it, always: never a warm copy elsewhere
//!   (there is none: an object is not a pool of instances), so
//!   [`Route::Local`] is never chosen for an object;
//! * a home admits every request for its objects (they queue at the
//!   object's input gate, [`crate::admission`]);
//! * a request the home refused, or that could not reach it, is **not**
//!   served on the receiving node ([`may_fall_back`] is false): the caller
//!   gets a 503 naming the home (or retries within its deadline), never a
//!   second instance.
//!
//! Nothing here does I/O or reads a clock: the live node and the data-center
//! simulator call the same functions, so the simulator measures the real
//! policy. (The simulator models Workers only; objects are not simulated.)

use std::fmt;
use std::str::FromStr;

/// Name of the response header that tells which [`Route`] served a request.
pub const ROUTE_HEADER: &str = "x-hearth-route";

/// How a request was served, as reported in [`ROUTE_HEADER`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Route {
    /// `local`: the Worker was warm on the node that received the request.
    Local,
    /// `home`: the receiving node is the Worker's home and served it.
    Home,
    /// `sharded`: forwarded to the home, which served it.
    Sharded,
    /// `fallback`: forwarded, but the home refused or could not be reached
    /// before it accepted, so the receiving node served it itself.
    Fallback,
}

impl Route {
    /// All routes, in declaration order (for metrics labels and reports).
    pub const ALL: [Route; 4] = [Route::Local, Route::Home, Route::Sharded, Route::Fallback];

    /// The header value: `local`, `home`, `sharded` or `fallback`.
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Local => "local",
            Route::Home => "home",
            Route::Sharded => "sharded",
            Route::Fallback => "fallback",
        }
    }

    /// The value for [`ROUTE_HEADER`].
    pub fn header_value(self) -> http::HeaderValue {
        http::HeaderValue::from_static(self.as_str())
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that is not one of the four route names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown route {0:?} (expected local, home, sharded or fallback)")]
pub struct UnknownRoute(pub String);

impl FromStr for Route {
    type Err = UnknownRoute;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Route::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownRoute(s.to_string()))
    }
}

/// What the receiving node should do with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision<'a, N: ?Sized> {
    /// Serve it on this node; the route is [`Route::Local`] or [`Route::Home`].
    Serve(Route),
    /// Send it to the Worker's home (the shard client's job). The route is
    /// settled by the home's answer ([`after_forward`]).
    Forward(&'a N),
}

/// The routing decision for a request arriving at `this_node` for a Worker
/// whose ring home is `home`, given whether the Worker is warm here.
///
/// `home` is `None` when there is no ring to ask (a standalone node, or an
/// empty ring): with no one else to ask, a node is everyone's home. A home
/// is compared with this node by `PartialEq<T>`, so the caller can pass
/// its ring members (`home`) and its own ID (`this_node`) and get the
/// member back in [`Decision::Forward`].
pub fn decide<'a, T: ?Sized, N: PartialEq<T> + ?Sized>(
    this_node: &T,
    home: Option<&'a N>,
    warm_here: bool,
) -> Decision<'a, N> {
    match home {
        _ if warm_here => Decision::Serve(Route::Local),
        Some(home) if home != this_node => Decision::Forward(home),
        _ => Decision::Serve(Route::Home),
    }
}

/// The prefix of a Durable Object's ring key, `do:<script>/<class>/<id>`
/// (`hearth_objects::ObjectKey::ring_key`). No script ID can start with it
/// (script IDs are lowercase letters, digits and `-`), so a key names a
/// Worker or an object, never both.
pub const OBJECT_KEY_PREFIX: &str = "do:";

/// Whether `key` (a script ID or a ring key) names a Durable Object.
pub fn is_object_key(key: &str) -> bool {
    key.starts_with(OBJECT_KEY_PREFIX)
}

/// The script whose class a Durable Object's ring key names (`counter`
/// for `do:counter/Counter/…`), or `None` for a key that is not an
/// object's: what per-Worker counters count an object's requests under.
pub fn object_script(key: &str) -> Option<&str> {
    key.strip_prefix(OBJECT_KEY_PREFIX)?.split('/').next()
}

/// The routing decision for a request for a Durable Object whose ring
/// home is `home`, arriving at `this_node`: served here only if this node
/// is its home ([`Route::Home`]; with no ring, a node is every object's
/// home), else forwarded to the home. Unlike [`decide`] there is no warm
/// copy to use: one object has one instance, at its home.
pub fn decide_object<'a, T: ?Sized, N: PartialEq<T> + ?Sized>(
    this_node: &T,
    home: Option<&'a N>,
) -> Decision<'a, N> {
    match home {
        Some(home) if home != this_node => Decision::Forward(home),
        _ => Decision::Serve(Route::Home),
    }
}

/// Whether a request for `key` that its home refused or could not take
/// may be served on the receiving node instead ([`Route::Fallback`]): a
/// Worker's may (its instances are interchangeable); a Durable Object's
/// may not, since that would make a second live instance of it.
pub fn may_fall_back(key: &str) -> bool {
    !is_object_key(key)
}

/// How the home dealt with a forwarded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HomeAnswer {
    /// The home accepted it (whatever happened afterwards: a home that fails
    /// after accepting yields a 502, not a silent replay).
    Accepted,
    /// The home refused it (overloaded) by handing back the lazy local
    /// instance.
    Refused,
    /// The home was down, unreachable, or did not answer before accepting.
    Unavailable,
}

/// The route of a forwarded request, from the home's answer.
///
/// After [`HomeAnswer::Refused`] the receiving node has the Worker warm (it
/// just cold-started it), so rule 1 of [`decide`] keeps its next requests
/// local until the Worker is evicted.
pub fn after_forward(answer: HomeAnswer) -> Route {
    match answer {
        HomeAnswer::Accepted => Route::Sharded,
        HomeAnswer::Refused | HomeAnswer::Unavailable => Route::Fallback,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_here_wins_even_when_another_node_is_home() {
        assert_eq!(
            decide("n1", Some("n2"), true),
            Decision::Serve(Route::Local)
        );
        assert_eq!(
            decide("n1", Some("n1"), true),
            Decision::Serve(Route::Local)
        );
    }

    #[test]
    fn cold_at_home_is_served_at_home() {
        assert_eq!(
            decide("n1", Some("n1"), false),
            Decision::Serve(Route::Home)
        );
    }

    #[test]
    fn with_no_ring_a_node_is_everyones_home() {
        assert_eq!(
            decide::<str, str>("n1", None, false),
            Decision::Serve(Route::Home)
        );
        assert_eq!(
            decide::<str, str>("n1", None, true),
            Decision::Serve(Route::Local)
        );
    }

    #[test]
    fn cold_elsewhere_is_forwarded_to_the_home() {
        assert_eq!(decide(&1u32, Some(&7u32), false), Decision::Forward(&7));
    }

    #[test]
    fn an_object_is_served_at_its_home_only() {
        // Elsewhere: forwarded, whatever is warm (nothing is, for an object).
        assert_eq!(decide_object("n1", Some("n2")), Decision::Forward("n2"));
        assert_eq!(
            decide_object("n2", Some("n2")),
            Decision::Serve(Route::Home)
        );
        assert_eq!(
            decide_object::<str, str>("n1", None),
            Decision::Serve(Route::Home)
        );
    }

    #[test]
    fn an_object_never_falls_back() {
        let key = "do:counter/Counter/00ff";
        assert!(is_object_key(key));
        assert!(!may_fall_back(key));
        assert!(!is_object_key("counter"));
        assert!(may_fall_back("counter"));
        assert_eq!(object_script(key), Some("counter"));
        assert_eq!(object_script("counter"), None);
    }

    #[test]
    fn answers_from_home_map_to_routes() {
        assert_eq!(after_forward(HomeAnswer::Accepted), Route::Sharded);
        assert_eq!(after_forward(HomeAnswer::Refused), Route::Fallback);
        assert_eq!(after_forward(HomeAnswer::Unavailable), Route::Fallback);
    }

    #[test]
    fn header_values_round_trip() {
        for route in Route::ALL {
            assert_eq!(route.as_str().parse::<Route>(), Ok(route));
            assert_eq!(route.header_value(), route.as_str());
        }
        assert!("elsewhere".parse::<Route>().is_err());
    }
}
