//! Estimates (next).
