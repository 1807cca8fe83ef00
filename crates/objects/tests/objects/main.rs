//! hearth-objects against its real stores: SQLite working copies, the
//! SQLite-file fence (in one process and across processes), etcd (started
//! by the tests; skipped with a message where `etcd` is absent, unless
//! HEARTH_REQUIRE_ETCD=1), and directory and in-memory blob stores.

mod alarms;
mod fencing;
mod storage;
mod support;
