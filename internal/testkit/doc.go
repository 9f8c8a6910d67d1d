// Package testkit holds the rigs of the tests, the demo and the bench, none
// of which the service imports: harness (workloads with known outcomes, the
// real binary driven from outside, SPEC §9's verification), paysim (a
// Stripe-like payment provider with faults), kafkatest (a real broker or
// franz-go's kfake), pgtest (a scratch database per test), logtest (logs
// captured per test) and poll (bounded waiting for a condition). They live
// under one folder so that internal/'s other packages are the service alone.
package testkit
