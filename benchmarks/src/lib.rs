//! Shared fixtures for the benchmarks: synthetic selector sets and DNS answers.
