#![no_main]
// The body is kiln_ep::fuzzing::node_import, which the replay test also runs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kiln_ep::fuzzing::node_import(data);
});
