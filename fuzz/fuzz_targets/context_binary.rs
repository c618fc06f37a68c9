#![no_main]
// The body is kiln_ep::fuzzing::context_binary, which the replay test also runs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kiln_ep::fuzzing::context_binary(data);
});
