//! Test support shared by the integration tests and benchmarks: a client
//! for Toxiproxy (latency and faults in front of real servers) and a TCP
//! echo server that gives the ground truth of what a proxy adds to a round
//! trip. Dev-dependency only: nothing here ships in capsule.

pub mod echo;
pub mod toxiproxy;
