//! The CollNet group-setup decoder and admission: arbitrary bytes on a new connection of a
//! group must never panic, must be refused unless they are exactly a hello the encoder writes,
//! and a hello is admitted only for the right group, another rank, not yet connected.

use rivet_core::collnet::hello::{HELLO_LEN, Hello};
use rivet_core::collnet::layout::MAX_RANKS;

/// One run of the target on libFuzzer's bytes.
pub fn check(data: &[u8]) {
    let Ok(hello) = Hello::decode(data) else {
        return;
    };
    assert_eq!(data.len(), HELLO_LEN);
    assert_eq!(&hello.encode()[..], data, "hello round trip");
    assert!((2..=MAX_RANKS).contains(&hello.nranks) && hello.rank < hello.nranks);
    // Admission as rank 0 of the hello's own group, with odd ranks connected already.
    match hello.admit(hello.group, hello.nranks, 0, |r| r % 2 == 1) {
        Ok(rank) => assert!(rank == hello.rank && rank != 0 && rank % 2 == 0),
        Err(_) => assert!(hello.rank == 0 || hello.rank % 2 == 1),
    }
    assert!(
        hello
            .admit(hello.group ^ 1, hello.nranks, 0, |_| false)
            .is_err()
    );
}
