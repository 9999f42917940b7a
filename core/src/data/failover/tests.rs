//! Unit tests of the decision machine and the plans.
