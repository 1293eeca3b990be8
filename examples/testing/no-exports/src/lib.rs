//! Test guest: a valid component of another world (it exports `run`, not the
//! actor's `handler` and `events`), which the runtime must refuse.

wit_bindgen::generate!({
    inline: "
        package test:no-exports;
        world no-exports {
            export run: func() -> u32;
        }
    ",
});

struct NoExports;

impl Guest for NoExports {
    fn run() -> u32 {
        7
    }
}

export!(NoExports);
