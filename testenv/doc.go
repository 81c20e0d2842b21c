// Package testenv gives tests a real shardpool: an in-process coordinator
// with an embedded JetStream server on a loopback port, in-process workers,
// and helpers to build the shardpool binary and run it as real processes
// for tests that kill them with real signals. Everything is cleaned up by
// t.Cleanup.
package testenv
