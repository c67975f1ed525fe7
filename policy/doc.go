// Package policy is the operator's steering wheel: the YAML schema, strict decoding with line numbers, validation,
// compilation to an immutable runtime snapshot, and the watcher that hot-reloads it with an atomic swap.
package policy
