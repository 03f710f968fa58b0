package service

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/reprise-rl/reprise/broker/wire"
)

// referenceCheckpoint decodes a checkpoint file with the generated code, as
// recovery did before readCheckpoint.
func referenceCheckpoint(data []byte) (*wire.Checkpoint, error) {
	var f wire.CheckpointFile
	if err := proto.Unmarshal(data, &f); err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(f.Checkpoint); !bytes.Equal(sum[:], f.Sha256) {
		return nil, errors.New("checksum mismatch")
	}
	var cp wire.Checkpoint
	if err := proto.Unmarshal(f.Checkpoint, &cp); err != nil {
		return nil, err
	}
	if cp.Version != checkpointVersion {
		return nil, errors.New("version")
	}
	return &cp, nil
}

func checkpointFile(tb testing.TB, cp *wire.Checkpoint) []byte {
	tb.Helper()
	inner, err := proto.Marshal(cp)
	if err != nil {
		tb.Fatal(err)
	}
	sum := sha256.Sum256(inner)
	data, err := proto.Marshal(&wire.CheckpointFile{Checkpoint: inner, Sha256: sum[:]})
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// withoutUnknown clears the unknown fields of m and of every message in it:
// readCheckpoint re-encodes the tags and lengths of the fields it passes to
// the generated code, so unknown fields may come out in another (shorter)
// encoding of the same bytes.
func withoutUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				withoutUnknown(v.List().Get(i).Message())
			}
		case fd.Message() != nil && !fd.IsMap():
			withoutUnknown(v.Message())
		}
		return true
	})
}

// FuzzReadCheckpoint: arbitrary bytes never panic readCheckpoint, every
// refusal is ErrCorruptCheckpoint (a reader that never fails cannot fail
// the store), and whatever it accepts the generated code decodes to the
// same checkpoint. With wrap, the input is the Checkpoint's bytes, put in a
// file with their right checksum, so that mutations get past it.
func FuzzReadCheckpoint(f *testing.F) {
	full := &wire.Checkpoint{
		Version: checkpointVersion, AppliedSequence: 41, CreatedUnixNano: 7, LastSweepUnixNano: 3,
		Tables: []*wire.TableCheckpoint{{ConfigJson: []byte(`{"name":"t"}`), Items: []*wire.ItemCheckpoint{{Key: 5, Priority: 0.5}}}},
		Chunks: [][]byte{{1, 2, 3}, bytes.Repeat([]byte{9}, 300), {}},
	}
	for _, cp := range []*wire.Checkpoint{full, {Version: checkpointVersion}, {Version: checkpointVersion + 1}} {
		f.Add(checkpointFile(f, cp), false)
		inner, err := proto.Marshal(cp)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(inner, true)
	}
	whole := checkpointFile(f, full)
	f.Add(whole[:len(whole)/2], false)
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}, false)
	f.Add([]byte{0x2a, 0xff, 0xff, 0xff, 0xff, 0x0f}, true)
	f.Fuzz(func(t *testing.T, data []byte, wrap bool) {
		if wrap {
			sum := sha256.Sum256(data)
			var err error
			if data, err = proto.Marshal(&wire.CheckpointFile{Checkpoint: data, Sha256: sum[:]}); err != nil {
				t.Fatal(err)
			}
		}
		got, err := readCheckpoint(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, ErrCorruptCheckpoint) {
				t.Fatalf("refused with %v, which is not ErrCorruptCheckpoint", err)
			}
			return
		}
		want, err := referenceCheckpoint(data)
		if err != nil {
			t.Fatalf("read a checkpoint the generated code refuses: %v", err)
		}
		withoutUnknown(got.ProtoReflect())
		withoutUnknown(want.ProtoReflect())
		if !proto.Equal(got, want) {
			t.Fatalf("read %v, the generated code %v", got, want)
		}
	})
}

// TestReadCheckpointRefusesDamage: Checkpoints with their right checksum
// but damaged inside are refused, as the generated code refuses them.
func TestReadCheckpointRefusesDamage(t *testing.T) {
	version := []byte{0x08, checkpointVersion}
	for name, body := range map[string][]byte{
		"a varint over 64 bits":   append(slices.Clone(version), 0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02),
		"a varint of 11 bytes":    append(slices.Clone(version), 0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x80, 0x01),
		"a chunk past the end":    append(slices.Clone(version), 0x2a, 0x05, 1, 2),
		"a table past the end":    append(slices.Clone(version), 0x22, 0x7f, 1),
		"a table that is not one": append(slices.Clone(version), 0x22, 0x02, 0xff, 0xff),
		"field number 0":          append(slices.Clone(version), 0x00, 0x01),
		"a varint cut short":      append(slices.Clone(version), 0x10, 0xff),
		"a fixed64 cut short":     append(slices.Clone(version), 0x39, 1, 2, 3),
		"no version":              {0x10, 0x01},
	} {
		sum := sha256.Sum256(body)
		file, err := proto.Marshal(&wire.CheckpointFile{Checkpoint: body, Sha256: sum[:]})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := referenceCheckpoint(file); err == nil {
			t.Fatalf("%s: the generated code reads it", name)
		}
		if _, err := readCheckpoint(bytes.NewReader(file)); !errors.Is(err, ErrCorruptCheckpoint) {
			t.Errorf("%s: %v, want ErrCorruptCheckpoint", name, err)
		}
	}
}
