//! Lock protocols for the communication path (seed 000).
