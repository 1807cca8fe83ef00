//! The host's `hearth:objects` interfaces: `ids` for every Worker (against
//! its Durable Object bindings), `storage` for the object an invocation runs
//! as (see [`crate::objects`]).

use std::sync::Arc;

use hearth_objects::Namespace;

use crate::instances::host::Host;
use crate::objects::ObjectCtx;

/// The bindings `wasmtime::component::bindgen!` generates from
/// `wit/hearth-objects`.
pub(crate) mod generated {
    wasmtime::component::bindgen!({
        path: "../wit/hearth-objects",
        inline: "
            package hearth:objects-host;
            world objects-imports {
                import hearth:objects/ids@0.1.0;
                import hearth:objects/storage@0.1.0;
            }
        ",
        world: "hearth:objects-host/objects-imports",
        imports: { default: async },
    });
}

use generated::hearth::objects::{ids, storage};

/// Links `hearth:objects/ids` and `hearth:objects/storage` into `linker`.
pub(crate) fn add_to_linker(
    linker: &mut wasmtime::component::Linker<Host>,
) -> wasmtime::Result<()> {
    use wasmtime::component::HasSelf;
    ids::add_to_linker::<Host, HasSelf<Host>>(linker, |h| h)?;
    storage::add_to_linker::<Host, HasSelf<Host>>(linker, |h| h)?;
    Ok(())
}

impl Host {
    /// The namespace of the running Worker's object binding `binding`.
    fn namespace(
        &self,
        binding: &str,
    ) -> Result<(Namespace, Arc<crate::objects::NodeObjects>), ids::IdError> {
        let caller = self.hooks.caller.as_ref().ok_or_else(|| {
            ids::IdError::UnknownBinding(
                "object IDs are made while a request runs, not at start-up".into(),
            )
        })?;
        let (_, target) = caller.bindings.object(binding).ok_or_else(|| {
            ids::IdError::UnknownBinding(format!(
                "this Worker has no Durable Object binding named {binding:?}"
            ))
        })?;
        Ok((
            Namespace::new(target.script_or(&caller.script_id), target.class()),
            caller.objects.clone(),
        ))
    }

    /// The object this invocation runs as.
    fn object(&self) -> Result<Arc<ObjectCtx>, storage::StorageError> {
        self.hooks
            .caller
            .as_ref()
            .and_then(|c| c.object.clone())
            .ok_or(storage::StorageError::NotAnObject)
    }
}

/// The crate's storage error as the guest sees it.
fn wit(e: hearth_objects::StorageError) -> storage::StorageError {
    use hearth_objects::StorageError as E;
    match e {
        E::Limit(m) => storage::StorageError::Limit(m),
        E::Invalid(m) => storage::StorageError::Invalid(m),
        E::Superseded => storage::StorageError::Superseded,
        E::Unavailable(m) => storage::StorageError::Unavailable(m),
    }
}

/// Runs `f` on the storage of `object` (the invocation's, if it runs as
/// one), counted as one call.
async fn with_storage<T>(
    object: Result<Arc<ObjectCtx>, storage::StorageError>,
    f: impl FnOnce(&mut hearth_objects::ObjectStorage) -> Result<T, hearth_objects::StorageError>,
) -> Result<T, storage::StorageError> {
    let object = object?;
    object.op().map_err(wit)?;
    let mut storage = object.storage.lock().await;
    let answer = f(&mut storage);
    object.saw(&answer);
    answer.map_err(wit)
}

impl ids::Host for Host {
    async fn id_from_name(
        &mut self,
        binding: String,
        name: String,
    ) -> Result<String, ids::IdError> {
        let (ns, objects) = self.namespace(&binding)?;
        let id = ns.id_from_name(&name);
        objects.remember_name(&ns, &id, &name);
        Ok(id.to_string())
    }

    async fn new_unique_id(&mut self, binding: String) -> Result<String, ids::IdError> {
        let (ns, _) = self.namespace(&binding)?;
        Ok(ns.new_unique_id().to_string())
    }

    async fn id_from_string(
        &mut self,
        binding: String,
        id: String,
    ) -> Result<String, ids::IdError> {
        let (ns, _) = self.namespace(&binding)?;
        ns.id_from_string(&id)
            .map(|id| id.to_string())
            .map_err(|e| {
                ids::IdError::InvalidId(format!(
                    "not an ID of Durable Object binding {binding:?} (class {} of script {}): {e}",
                    ns.class, ns.script
                ))
            })
    }
}

impl storage::Host for Host {
    async fn this_object(&mut self) -> Option<storage::ObjectInfo> {
        let object = self.object().ok()?;
        Some(storage::ObjectInfo {
            class: object.key.namespace.class.clone(),
            id: object.key.id.to_string(),
            name: object.name.clone(),
        })
    }

    async fn get(
        &mut self,
        keys: Vec<String>,
    ) -> Result<Vec<Option<Vec<u8>>>, storage::StorageError> {
        with_storage(self.object(), |s| s.get(&keys)).await
    }

    async fn put(&mut self, entries: Vec<(String, Vec<u8>)>) -> Result<(), storage::StorageError> {
        with_storage(self.object(), |s| s.put(entries)).await
    }

    async fn delete(&mut self, keys: Vec<String>) -> Result<u32, storage::StorageError> {
        with_storage(self.object(), |s| s.delete(&keys)).await
    }

    async fn list(
        &mut self,
        options: storage::ListOptions,
    ) -> Result<Vec<(String, Vec<u8>)>, storage::StorageError> {
        let options = hearth_objects::ListOptions {
            start: options.start,
            start_after: options.start_after,
            end: options.end,
            prefix: options.prefix,
            reverse: options.reverse,
            limit: options.limit,
        };
        with_storage(self.object(), |s| s.list(&options)).await
    }

    async fn delete_all(&mut self) -> Result<(), storage::StorageError> {
        with_storage(self.object(), |s| s.delete_all()).await
    }

    async fn transaction_begin(&mut self) -> Result<(), storage::StorageError> {
        with_storage(self.object(), |s| s.transaction_begin()).await
    }

    async fn transaction_commit(&mut self) -> Result<(), storage::StorageError> {
        with_storage(self.object(), |s| s.transaction_commit()).await
    }

    async fn transaction_rollback(&mut self) -> Result<(), storage::StorageError> {
        with_storage(self.object(), |s| s.transaction_rollback()).await
    }

    async fn get_alarm(&mut self) -> Result<Option<u64>, storage::StorageError> {
        with_storage(self.object(), |s| s.get_alarm()).await
    }

    async fn set_alarm(&mut self, at_ms: u64) -> Result<(), storage::StorageError> {
        with_storage(self.object(), |s| s.set_alarm(at_ms)).await
    }

    async fn delete_alarm(&mut self) -> Result<(), storage::StorageError> {
        with_storage(self.object(), |s| s.delete_alarm()).await
    }

    async fn sync(&mut self) -> Result<(), storage::StorageError> {
        let object = self.object()?;
        object.op().map_err(wit)?;
        object.flush().await.map_err(wit)
    }
}
