//! The shared pair tests (`crate::sim::suite`) on the simulated fabric.

crate::data_pair_tests!(crate::sim::DataPair);
