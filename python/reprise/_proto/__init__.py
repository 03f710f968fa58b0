"""Generated protobuf code for broker/wire/reprise.proto (see scripts/gen-python-proto.sh)."""
