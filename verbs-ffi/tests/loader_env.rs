//! `RIVET_IBVERBS_LIB` overrides the library path, and a missing library surfaces as a typed error
//! from every entry point. The process-wide loader caches its first result, so the check runs in a
//! child process (this test binary re-executed with the variable set).

use std::process::Command;

use rivet_verbs_ffi::discover::DiscoverOptions;
use rivet_verbs_ffi::{DeviceList, DiscoverError, VerbsError, discover, verbs};

const BOGUS: &str = "/nonexistent/rivet-test/libibverbs.so.1";
const CHILD_MARKER: &str = "RIVET_LOADER_ENV_CHILD";

#[test]
fn override_with_missing_library_gives_typed_errors() {
    if std::env::var_os(CHILD_MARKER).is_none() {
        let status = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "override_with_missing_library_gives_typed_errors",
                "--nocapture",
            ])
            .env(CHILD_MARKER, "1")
            .env("RIVET_IBVERBS_LIB", BOGUS)
            .status()
            .unwrap();
        assert!(status.success(), "child run failed: {status}");
        return;
    }
    let err = verbs().unwrap_err();
    assert!(
        matches!(&err, VerbsError::Load { library, .. } if library == BOGUS),
        "{err:?}"
    );
    assert!(err.to_string().contains(BOGUS), "{err}");
    // The failure is remembered, not retried differently.
    assert_eq!(verbs().unwrap_err(), err);
    assert_eq!(DeviceList::new().unwrap_err(), err);
    match discover(&DiscoverOptions::default()) {
        Err(DiscoverError::Library(e)) => assert_eq!(e, err),
        other => panic!("expected DiscoverError::Library, got {other:?}"),
    }
    assert!(
        rivet_verbs_ffi::mlx5().is_err(),
        "mlx5 needs libibverbs first"
    );
    println!("child saw: {err}");
}
