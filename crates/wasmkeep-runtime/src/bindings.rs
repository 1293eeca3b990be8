//! The generated bindings of world `wasmkeep:actor/actor` (wit/actor.wit), in
//! one place. Imports are synchronous host calls except `actors.call`, which
//! awaits another actor; exports are called with `call_async` so epoch
//! interruption can yield to tokio and stop a guest at its time limit.

wasmtime::component::bindgen!({
    world: "actor",
    path: "../../wit",
    imports: {
        "wasmkeep:actor/actors.call": async,
    },
    exports: {
        default: async,
    },
});
