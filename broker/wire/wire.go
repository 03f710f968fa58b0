// Package wire is Reprise's wire format and owns every byte layout: the
// protobuf messages that travel on NATS subjects (generated from
// reprise.proto), the codec that turns steps of tensors into compressed
// chunks and back, and the hand-written encoders and decoders of the hot
// paths (fast.go, sample.go), which read chunks without copying them and
// write sample responses straight from the tables' samples.
package wire

//go:generate sh -c "protoc --plugin=protoc-gen-go=$(go tool -n protoc-gen-go) --go_out=. --go_opt=paths=source_relative reprise.proto"
