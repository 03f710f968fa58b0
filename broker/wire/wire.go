// Package wire is Reprise's wire format: the protobuf messages that travel on
// NATS subjects, and the codec that turns steps of tensors into compressed
// chunks and back.
package wire

//go:generate sh -c "protoc --plugin=protoc-gen-go=$(go tool -n protoc-gen-go) --go_out=. --go_opt=paths=source_relative reprise.proto"
