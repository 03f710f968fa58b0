// Package broker is Reprise's client side on NATS JetStream: actors publish
// trajectories through a Producer, and learners sample, read and mutate
// tables through a Client (SampleBatch stacks a batch's items, one tensor a
// column; a Sampler or BatchSampler keeps several sample requests in
// flight). Neither connects to the table service directly: inserts and
// mutations go through a JetStream stream, requests through NATS
// request-reply. The table service that consumes the stream and answers the
// requests is package broker/service; the byte layouts both sides use are
// package broker/wire. A table spread over several services, its shards,
// is written through a ShardedProducer and read through a ShardedClient.
//
// Errors are matched with errors.Is against the Err values here, which the
// service returns too. Roles (RolePermissions) say what each kind of NATS
// user of a deployment may publish and subscribe to.
package broker
