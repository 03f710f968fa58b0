package service

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/reprise-rl/reprise/broker/internal/protocol"
)

// CheckpointStore keeps checkpoints by name. Names sort in the order the
// checkpoints were taken. Save must be atomic: a checkpoint that was not
// written whole must not be listed, or must fail to Load.
type CheckpointStore interface {
	// Save stores what r reads (a checkpoint is mostly its tables' chunks,
	// read as they are held, so as not to copy them all at once).
	Save(ctx context.Context, name string, r io.Reader) error
	// Load opens a checkpoint for reading, which ends at its last byte or
	// with the error that stopped it (a digest that does not match, say);
	// the caller closes it.
	Load(ctx context.Context, name string) (io.ReadCloser, error)
	List(ctx context.Context) ([]string, error)
	Delete(ctx context.Context, name string) error
}

// ErrNoCheckpoint is returned by Load for a name the store does not hold.
var ErrNoCheckpoint = errors.New("broker: no such checkpoint")

// checkpointName sorts by epoch, then by the sequence the checkpoint
// resumes after. The epoch orders the checkpoints of successive active
// services (WithStandby): recovery takes the newest epoch's newest, so a
// checkpoint a former active service writes after it lost the lease never
// wins over the current one's. Epoch 0 keeps the names of checkpoints
// written before epochs existed, which sort below every other ("0" < "e").
func checkpointName(epoch, applied uint64) string {
	if epoch == 0 {
		return fmt.Sprintf("checkpoint-%020d", applied)
	}
	return fmt.Sprintf("checkpoint-e%020d-%020d", epoch, applied)
}

// parseCheckpointName reads what checkpointName wrote.
func parseCheckpointName(name string) (epoch, applied uint64, ok bool) {
	if _, err := fmt.Sscanf(name, checkpointPrefix+"e%020d-%020d", &epoch, &applied); err == nil {
		return epoch, applied, true
	}
	if _, err := fmt.Sscanf(name, checkpointPrefix+"%020d", &applied); err == nil {
		return 0, applied, true
	}
	return 0, 0, false
}

const checkpointPrefix = "checkpoint-"

// ObjectStoreCheckpoints keeps checkpoints in a JetStream object store
// bucket, replicated like the stream when the bucket is.
type ObjectStoreCheckpoints struct {
	js     jetstream.JetStream
	config jetstream.ObjectStoreConfig

	mu sync.Mutex // guards os, replaced if the bucket is deleted
	os jetstream.ObjectStore
}

// NewObjectStoreCheckpoints opens (creating if needed) the bucket.
func NewObjectStoreCheckpoints(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) (*ObjectStoreCheckpoints, error) {
	cfg := jetstream.ObjectStoreConfig{
		Bucket:      bucket,
		Description: "Reprise checkpoints",
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	}
	os, err := js.CreateOrUpdateObjectStore(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("broker: checkpoint bucket %s: %w", bucket, err)
	}
	return &ObjectStoreCheckpoints{js: js, config: cfg, os: os}, nil
}

func (s *ObjectStoreCheckpoints) store() jetstream.ObjectStore {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.os
}

// ensure recreates the bucket if it was deleted, and says so.
func (s *ObjectStoreCheckpoints) ensure(ctx context.Context) (bool, error) {
	_, err := s.js.ObjectStore(ctx, s.config.Bucket)
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return false, nil // there, or the server cannot tell now
	}
	os, err := s.js.CreateOrUpdateObjectStore(ctx, s.config)
	if err != nil {
		return false, fmt.Errorf("broker: recreating checkpoint bucket %s: %w", s.config.Bucket, err)
	}
	s.mu.Lock()
	s.os = os
	s.mu.Unlock()
	return true, nil
}

// ensure recreates the directory if it was removed, and says so.
func (f *FileCheckpoints) ensure(context.Context) (bool, error) {
	if _, err := os.Stat(f.dir); !errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		return false, fmt.Errorf("broker: recreating checkpoint directory: %w", err)
	}
	return true, nil
}

// recreatable is a checkpoint store that can notice its storage vanishing
// and recreate it: the service then writes a checkpoint at once, since the
// stream may already be trimmed below what the lost ones covered.
type recreatable interface {
	ensure(ctx context.Context) (recreated bool, err error)
}

// checkpointBucket is the default bucket of a prefix's checkpoints.
func checkpointBucket(subj protocol.Subjects) string { return subj.Stream() + "_CHECKPOINTS" }

// A checkpoint holds every table's chunks, and a large one takes minutes to
// move. nats.go bounds a call whose context has no deadline by the
// JetStream context's default timeout (5 s), and a read of an object by it
// as a whole: a checkpoint of a few hundred MB then failed to load, and
// recovery skipped it for an older one or for a stream its limits had
// already cut, losing acknowledged items. So reads and writes of a
// checkpoint get their own deadline, which grows with its size.
const (
	objectCallTimeout = 30 * time.Second
	// objectMinRate is the slowest transfer waited for: the deadline of a
	// transfer of n bytes is objectCallTimeout + n/objectMinRate.
	objectMinRate = 4 << 20
	// objectUnsizedTimeout bounds a write whose size is not known.
	objectUnsizedTimeout = time.Hour
)

func transferDeadline(ctx context.Context, size uint64) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, objectCallTimeout+time.Duration(size/objectMinRate)*time.Second)
}

// writeDeadline is transferDeadline for what r reads, when r tells its
// size (a checkpoint from the service, a bytes.Reader).
func writeDeadline(ctx context.Context, r io.Reader) (context.Context, context.CancelFunc) {
	if s, ok := r.(interface{ Size() int64 }); ok {
		return transferDeadline(ctx, uint64(max(s.Size(), 0)))
	}
	return context.WithTimeout(ctx, objectUnsizedTimeout)
}

// objectChunkSize is the size of the messages a checkpoint is stored in.
// nats.go publishes an object's messages with up to 4000 unacknowledged,
// and the server drops what comes into a stream beyond 128 MiB waiting to
// be stored, failing the write ("too many requests"); at nats.go's default
// of 128 KiB a message, a checkpoint of a few hundred MB failed this way
// under load, the one written at shutdown included. 4000 messages of 16 KiB
// stay under half that bound.
const objectChunkSize = 16 << 10

// Save writes the checkpoint; the object store lists it once its last
// chunk and its digest are stored.
func (s *ObjectStoreCheckpoints) Save(ctx context.Context, name string, r io.Reader) error {
	ctx, cancel := writeDeadline(ctx, r)
	defer cancel()
	meta := jetstream.ObjectMeta{Name: name, Opts: &jetstream.ObjectMetaOptions{ChunkSize: objectChunkSize}}
	if _, err := s.store().Put(ctx, meta, r); err != nil {
		return fmt.Errorf("broker: saving checkpoint %s: %w", name, err)
	}
	return nil
}

// Load opens a checkpoint; the object store checks its digest as the last
// bytes are read. The read has a deadline of its own, which grows with the
// checkpoint's size and ends when the reader is closed.
func (s *ObjectStoreCheckpoints) Load(ctx context.Context, name string) (io.ReadCloser, error) {
	loadError := func(err error) error {
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			return fmt.Errorf("%w: %s", ErrNoCheckpoint, name)
		}
		return fmt.Errorf("broker: loading checkpoint %s: %w", name, err)
	}
	store := s.store()
	ictx, cancel := context.WithTimeout(ctx, objectCallTimeout)
	info, err := store.GetInfo(ictx, name)
	cancel()
	if err != nil {
		return nil, loadError(err)
	}
	ctx, cancel = transferDeadline(ctx, info.Size)
	obj, err := store.Get(ctx, name)
	if err != nil {
		cancel()
		return nil, loadError(err)
	}
	return &objectReader{ObjectResult: obj, cancel: cancel}, nil
}

// objectReader ends its read's deadline when closed.
type objectReader struct {
	jetstream.ObjectResult
	cancel context.CancelFunc
}

func (o *objectReader) Close() error {
	defer o.cancel()
	return o.ObjectResult.Close()
}

// objectListTimeout bounds one listing of the bucket. nats.go's listing
// waits for the end of the bucket's contents, and when its first look at an
// empty bucket fails (a bucket just created on a cluster, whose stream has
// no leader yet) that end never comes.
const objectListTimeout = 10 * time.Second

// List names the stored checkpoints, oldest first.
func (s *ObjectStoreCheckpoints) List(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, objectListTimeout)
	defer cancel()
	infos, err := s.store().List(ctx, jetstream.ListObjectsShowDeleted())
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("broker: listing checkpoints: %w", err)
	}
	var names, deleted []string
	for _, in := range infos {
		switch {
		case !strings.HasPrefix(in.Name, checkpointPrefix):
		case in.Deleted:
			deleted = append(deleted, in.Name)
		default:
			names = append(names, in.Name)
		}
	}
	// Markers left by deletes that did not purge theirs (a failure, or an
	// older version), a few at a time.
	for _, name := range deleted[:min(len(deleted), markersPurgedPerList)] {
		if s.forget(ctx, name) != nil {
			break
		}
	}
	slices.Sort(names)
	return names, nil
}

// markersPurgedPerList bounds the delete markers one listing purges: more
// than a checkpoint leaves, so that they go, and few enough for the
// listing to stay quick.
const markersPurgedPerList = 16

// Delete removes a checkpoint.
func (s *ObjectStoreCheckpoints) Delete(ctx context.Context, name string) error {
	if err := s.store().Delete(ctx, name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("broker: deleting checkpoint %s: %w", name, err)
	}
	// A marker left now is purged by a later listing: the checkpoint is
	// gone either way, and a failure here would stop the stream's trim.
	_ = s.forget(ctx, name)
	return nil
}

// forget purges the marker that nats.go's Delete leaves under a deleted
// object's name. Every checkpoint has a name of its own, so the markers
// piled up, one a checkpoint, forever, each one read by every listing (16
// ms for 1,000 of them, 560 ms for 50,000, 35 days of one a minute). The
// subject is the object store's (ADR-20): the bucket's meta subject and
// the name in URL-safe base64. Only the marker and what came before it go:
// a checkpoint written again under the name meanwhile stays.
func (s *ObjectStoreCheckpoints) forget(ctx context.Context, name string) error {
	bucket := s.config.Bucket
	st, err := s.js.Stream(ctx, "OBJ_"+bucket)
	if err != nil {
		return err
	}
	subject := "$O." + bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(name))
	m, err := st.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	var meta struct {
		Deleted bool `json:"deleted"`
	}
	if json.Unmarshal(m.Data, &meta) != nil || !meta.Deleted {
		return nil // a checkpoint's, written again under the name
	}
	return st.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(m.Sequence+1))
}

// FileCheckpoints keeps checkpoints as files in a directory.
type FileCheckpoints struct {
	dir string
}

// NewFileCheckpoints uses dir, creating it if needed.
func NewFileCheckpoints(dir string) (*FileCheckpoints, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("broker: checkpoint directory: %w", err)
	}
	return &FileCheckpoints{dir: dir}, nil
}

// Save writes to a temporary file, syncs it and renames it into place, so
// a crash leaves either the whole checkpoint or none. A save whose ctx ends
// stops between writes and leaves none: a checkpoint of many GiB on a slow
// disk would otherwise hold a shutdown past its deadline.
func (f *FileCheckpoints) Save(ctx context.Context, name string, r io.Reader) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("broker: saving checkpoint %s: %w", name, err)
	}
	tmp, err := os.CreateTemp(f.dir, tempPrefix+name+"-*")
	if err != nil {
		return fmt.Errorf("broker: saving checkpoint %s: %w", name, err)
	}
	_, err = io.Copy(ctxWriter{ctx, tmp}, r)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// The last look: a save given up on during the sync is not renamed
		// into place after its caller went on.
		err = ctx.Err()
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(f.dir, name))
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("broker: saving checkpoint %s: %w", name, err)
	}
	// The rename is durable once the directory is synced.
	if d, err := os.Open(f.dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// ctxWriter fails every write once its ctx has ended. It hides the file's
// ReadFrom, so that io.Copy writes through it.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(b)
}

// Load opens a checkpoint file, whose reads fail once ctx ends, as the
// object store's do.
func (f *FileCheckpoints) Load(ctx context.Context, name string) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("broker: loading checkpoint %s: %w", name, err)
	}
	file, err := os.Open(filepath.Join(f.dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNoCheckpoint, name)
	}
	if err != nil {
		return nil, fmt.Errorf("broker: loading checkpoint %s: %w", name, err)
	}
	return ctxFile{ctx: ctx, file: file}, nil
}

// ctxFile is a checkpoint file whose reads stop once ctx ends. It hides
// the file's WriteTo, so that io.Copy reads through it.
type ctxFile struct {
	ctx  context.Context
	file *os.File
}

func (c ctxFile) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.file.Read(b)
}

func (c ctxFile) Close() error { return c.file.Close() }

// listBatch is how many directory entries List reads between looks at its
// context: a directory of many files, or on a slow network file system,
// takes long to read whole.
const listBatch = 256

// List names the checkpoint files, oldest first.
func (f *FileCheckpoints) List(ctx context.Context) ([]string, error) {
	var names []string
	err := f.readDir(ctx, func(e os.DirEntry) {
		if strings.HasPrefix(e.Name(), checkpointPrefix) && e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	})
	if err != nil {
		return nil, fmt.Errorf("broker: listing checkpoints: %w", err)
	}
	slices.Sort(names)
	return names, nil
}

// readDir calls each with the directory's entries, listBatch at a time,
// until ctx ends.
func (f *FileCheckpoints) readDir(ctx context.Context, each func(os.DirEntry)) error {
	d, err := os.Open(f.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		entries, err := d.ReadDir(listBatch)
		for _, e := range entries {
			each(e)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Delete removes a checkpoint file, unless ctx has ended, and what saves
// of it or of older checkpoints left: a save that never returned (its
// process killed, as one whose final checkpoint outlasts its SIGTERM
// grace period is) leaves its temporary file, as large as the checkpoint,
// which nothing else removes, and every such stop left another. Saves are
// made one at a time, in order, and a checkpoint is deleted only once a
// newer one was written, so none of those is still being written but one
// of a service that lost its lease, which a newer epoch's outranks anyway.
func (f *FileCheckpoints) Delete(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("broker: deleting checkpoint %s: %w", name, err)
	}
	if err := os.Remove(filepath.Join(f.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("broker: deleting checkpoint %s: %w", name, err)
	}
	// The checkpoint is gone: what is left here is found by a later delete.
	_ = f.readDir(ctx, func(e os.DirEntry) {
		if of, ok := savingOf(e.Name()); ok && of <= name {
			os.Remove(filepath.Join(f.dir, e.Name()))
		}
	})
	return nil
}

// tempPrefix begins the names of the files Save writes before renaming
// them into place.
const tempPrefix = ".tmp-"

// savingOf names the checkpoint whose save wrote the temporary file
// named file (tempPrefix, the checkpoint's name, "-" and CreateTemp's
// random digits).
func savingOf(file string) (string, bool) {
	rest, ok := strings.CutPrefix(file, tempPrefix)
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, '-')
	if i < 0 {
		return "", false
	}
	return rest[:i], strings.HasPrefix(rest[:i], checkpointPrefix)
}
