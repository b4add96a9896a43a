// Package lab is the state store's laboratory: writing a store as it
// looks after months of use, reading what a benchmark window's orders
// spent in each stage, and where the write-ahead log stands. Benchmarks
// and tests use it; no service does.
package lab
