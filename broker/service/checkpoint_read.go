package service

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"math"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/reprise-rl/reprise/broker/wire"
)

// readCheckpoint decodes a checkpoint file as it reads it. The chunks, most
// of a checkpoint's bytes, each go into an allocation of their own as they
// arrive, and the rest of the Checkpoint is gathered for the generated code:
// reading the file whole, then decoding it with the generated code (which
// copies every bytes field), held a large checkpoint three times over while
// recovery restored it. Nothing is returned unless the checksum that
// follows the Checkpoint matches what was read.
//
// A file that ends early or does not decode is ErrCorruptCheckpoint. An
// error of r's is returned as it is: the store failed, which says nothing
// of the checkpoint.
func readCheckpoint(r io.Reader) (*wire.Checkpoint, error) {
	s := &checkpointScanner{r: bufio.NewReaderSize(r, checkpointReadBuffer)}
	var (
		cp   *wire.Checkpoint
		got  []byte
		want []byte
	)
	for {
		num, typ, err := s.tag()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		switch {
		case num == fieldFileCheckpoint && typ == protowire.BytesType:
			if cp != nil {
				return nil, corruptf("the file holds two checkpoints")
			}
			if cp, got, err = s.checkpoint(); err != nil {
				return nil, err
			}
		case num == fieldFileSHA256 && typ == protowire.BytesType:
			n, err := s.length(sha256.Size)
			if err != nil {
				return nil, err
			}
			want = make([]byte, n)
			if err := s.full(want); err != nil {
				return nil, err
			}
		default:
			if _, err := s.field(nil, num, typ); err != nil {
				return nil, err
			}
		}
	}
	if cp == nil {
		return nil, corruptf("the file holds no checkpoint")
	}
	if !bytes.Equal(got, want) {
		return nil, corruptf("checksum mismatch (torn or damaged write)")
	}
	if cp.Version != checkpointVersion {
		return nil, corruptf("version %d, this build reads %d", cp.Version, checkpointVersion)
	}
	return cp, nil
}

// checkpointReadBuffer is readCheckpoint's read buffer; chunks at least as
// large are read straight into their own memory.
const checkpointReadBuffer = 1 << 20

// maxExactAlloc is the largest field read into memory of the size its
// length prefix claims before the bytes arrive. A larger one grows as they
// do, so that a damaged length costs no more than the bytes the file holds.
const maxExactAlloc = 64 << 20

func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorruptCheckpoint, fmt.Sprintf(format, args...))
}

// checkpointScanner reads a checkpoint file's fields. Within the
// Checkpoint (body), every byte read counts against the Checkpoint's
// declared length and goes into its hash; the bytes of tags and lengths
// wait in unhashed and go in with the next field's bytes, since a write to
// the hash per byte cost more than the rest of reading a small chunk.
type checkpointScanner struct {
	r        *bufio.Reader
	body     bool
	left     int64
	hash     hash.Hash
	unhashed []byte
}

// readErr maps the end of r to a checkpoint that ends early.
func readErr(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return corruptf("the file ends in the middle of a field")
	}
	return err
}

func (s *checkpointScanner) readByte() (byte, error) {
	if s.body && s.left == 0 {
		return 0, corruptf("a field runs past the end of the checkpoint")
	}
	b, err := s.r.ReadByte()
	if err != nil {
		return 0, readErr(err)
	}
	if s.body {
		s.left--
		s.unhashed = append(s.unhashed, b)
	}
	return b, nil
}

func (s *checkpointScanner) full(p []byte) error {
	if s.body && int64(len(p)) > s.left {
		return corruptf("a field of %d bytes runs past the end of the checkpoint", len(p))
	}
	if _, err := io.ReadFull(s.r, p); err != nil {
		return readErr(err)
	}
	if s.body {
		s.left -= int64(len(p))
		s.flushHash()
		s.hash.Write(p)
	}
	return nil
}

func (s *checkpointScanner) flushHash() {
	s.hash.Write(s.unhashed)
	s.unhashed = s.unhashed[:0]
}

func (s *checkpointScanner) varint() (uint64, error) {
	var v uint64
	for shift := 0; shift < 64; shift += 7 {
		b, err := s.readByte()
		if err != nil {
			return 0, err
		}
		if shift == 63 && b > 1 {
			return 0, corruptf("a varint over 64 bits")
		}
		v |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return v, nil
		}
	}
	return 0, corruptf("a varint over 64 bits")
}

// tag reads a field's tag; io.EOF, unwrapped, when the file ends before it
// outside the Checkpoint.
func (s *checkpointScanner) tag() (protowire.Number, protowire.Type, error) {
	if !s.body {
		if _, err := s.r.Peek(1); err == io.EOF {
			return 0, 0, io.EOF
		}
	}
	v, err := s.varint()
	if err != nil {
		return 0, 0, err
	}
	num, typ := protowire.DecodeTag(v)
	if !num.IsValid() {
		return 0, 0, corruptf("field number %d", num)
	}
	return num, typ, nil
}

// length reads a bytes field's length, at most limit.
func (s *checkpointScanner) length(limit uint64) (int, error) {
	n, err := s.varint()
	if err != nil {
		return 0, err
	}
	if s.body {
		limit = min(limit, uint64(s.left))
	}
	if n > limit || n > math.MaxInt {
		return 0, corruptf("a field of %d bytes, more than the %d that may follow", n, limit)
	}
	return int(n), nil
}

// appendBytes appends the next n bytes to b.
func (s *checkpointScanner) appendBytes(b []byte, n int) ([]byte, error) {
	for n > 0 {
		step := min(n, maxExactAlloc)
		b = slices.Grow(b, step)
		at := len(b)
		b = b[:at+step]
		if err := s.full(b[at:]); err != nil {
			return nil, err
		}
		n -= step
	}
	return b, nil
}

// field reads the rest of a field whose tag was read, appending it, tag
// and all, to b.
func (s *checkpointScanner) field(b []byte, num protowire.Number, typ protowire.Type) ([]byte, error) {
	b = protowire.AppendTag(b, num, typ)
	switch typ {
	case protowire.VarintType:
		v, err := s.varint()
		return protowire.AppendVarint(b, v), err
	case protowire.Fixed32Type:
		return s.appendBytes(b, 4)
	case protowire.Fixed64Type:
		return s.appendBytes(b, 8)
	case protowire.BytesType:
		n, err := s.length(math.MaxInt64)
		if err != nil {
			return nil, err
		}
		return s.appendBytes(protowire.AppendVarint(b, uint64(n)), n)
	}
	return nil, corruptf("field %d has wire type %d, which checkpoints do not use", num, typ)
}

// checkpoint reads the Checkpoint, whose length comes next, and returns it
// with its SHA-256. Its chunks are read into memory of their own; every
// other field is gathered for proto.Unmarshal.
func (s *checkpointScanner) checkpoint() (*wire.Checkpoint, []byte, error) {
	n, err := s.length(math.MaxInt64)
	if err != nil {
		return nil, nil, err
	}
	s.body, s.left, s.hash = true, int64(n), sha256.New()
	var (
		rest   []byte
		chunks [][]byte
	)
	for s.left > 0 {
		num, typ, err := s.tag()
		if err != nil {
			return nil, nil, err
		}
		if num != fieldCheckpointChunks || typ != protowire.BytesType {
			if rest, err = s.field(rest, num, typ); err != nil {
				return nil, nil, err
			}
			continue
		}
		n, err := s.length(math.MaxInt64)
		if err != nil {
			return nil, nil, err
		}
		var chunk []byte
		if n <= maxExactAlloc {
			chunk = make([]byte, n)
			err = s.full(chunk)
		} else {
			chunk, err = s.appendBytes(nil, n)
		}
		if err != nil {
			return nil, nil, err
		}
		chunks = append(chunks, chunk)
	}
	s.flushHash()
	s.body = false
	cp := new(wire.Checkpoint)
	if err := proto.Unmarshal(rest, cp); err != nil {
		return nil, nil, corruptf("%v", err)
	}
	cp.Chunks = chunks
	return cp, s.hash.Sum(nil), nil
}
