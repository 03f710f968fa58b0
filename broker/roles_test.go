package broker

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reprise-rl/reprise/broker/service"

	"github.com/reprise-rl/reprise/internal/testutil"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/reprise-rl/reprise/embeddednats"
	"github.com/reprise-rl/reprise/tables"
)

// matches reports whether subject (taken literally, as the server's
// permission check takes a subscription's subject) matches pattern.
func matches(pattern, subject string) bool {
	pt, st := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, p := range pt {
		switch {
		case p == ">":
			return len(st) > i
		case i >= len(st):
			return false
		case p != "*" && p != st[i]:
			return false
		}
	}
	return len(pt) == len(st)
}

func allowed(r SubjectRules, subject string) bool {
	match := func(p string) bool { return matches(p, subject) }
	return slices.ContainsFunc(r.Allow, match) && !slices.ContainsFunc(r.Deny, match)
}

func TestMatches(t *testing.T) {
	for _, tt := range []struct {
		pattern, subject string
		want             bool
	}{
		{"a.b", "a.b", true},
		{"a.b", "a.b.c", false},
		{"a.*", "a.b", true},
		{"a.*", "a.b.c", false},
		{"a.>", "a", false},
		{"a.>", "a.b.c", true},
		{"a.*.c", "a.b.c", true},
		{"a.b.>", "a.>", false},
		{"a.>", "a.>", true},
	} {
		if got := matches(tt.pattern, tt.subject); got != tt.want {
			t.Errorf("matches(%q, %q) = %t, want %t", tt.pattern, tt.subject, got, tt.want)
		}
	}
}

func TestRolePermissions(t *testing.T) {
	const (
		pub = "pub"
		sub = "sub"
	)
	type check struct {
		op, subject string
		want        bool
	}
	// Subjects of prefix "rl.x": stream REPRISE_RL_X, checkpoint bucket
	// REPRISE_RL_X_CHECKPOINTS, object store stream OBJ_<bucket>.
	const (
		stream  = "REPRISE_RL_X"
		objects = "OBJ_REPRISE_RL_X_CHECKPOINTS"
		bucket  = "REPRISE_RL_X_CHECKPOINTS"
		lease   = "REPRISE_RL_X_LEASE" // KV bucket, stream KV_<bucket>
	)
	// What no role but the one named may do.
	common := func(role Role) []check {
		return []check{
			// Another user's inbox and every inbox.
			{sub, "_INBOX.other.x", false},
			{sub, "_INBOX.>", false},
			{sub, ">", false},
			{pub, "_INBOX.other.x", role == RoleService},
			// Other deployments and other streams.
			{pub, "rl.y.data.insert", false},
			{sub, "rl.y.applied", false},
			{pub, "$JS.API.STREAM.DELETE.OTHER", false},
			{pub, "$JS.API.STREAM.INFO.OTHER", false},
			{pub, "$JS.API.CONSUMER.CREATE.OTHER." + stream + ".x", false},
			{pub, "$JS.API.CONSUMER.MSG.NEXT.OTHER." + stream, false},
			{pub, "$JS.API.STREAM.NAMES", false},
			{pub, "$JS.API.META.LEADER.STEPDOWN", false},
			{pub, "$JS.API.ACCOUNT.PURGE.x", false},
			// Serving requests is the service's alone.
			{sub, "rl.x.api.sample", role == RoleService},
			{sub, "rl.x.api.>", role == RoleService},
			{sub, "$SRV.PING", role == RoleService},
			// Its own inbox.
			{sub, "_INBOX.u.abc.*", true},
			// The lease: the service's and admins' only, and no other bucket.
			{pub, "$KV." + lease + ".active", role == RoleService || role == RoleAdmin},
			{pub, "$JS.API.STREAM.INFO.KV_" + lease, role == RoleService || role == RoleAdmin},
			{pub, "$JS.API.STREAM.CREATE.KV_" + lease, role == RoleService || role == RoleAdmin},
			{pub, "$JS.API.DIRECT.GET.KV_" + lease + ".$KV." + lease + ".active", role == RoleService || role == RoleAdmin},
			{pub, "$KV.OTHER.active", false},
			{pub, "$JS.API.STREAM.INFO.KV_OTHER", false},
		}
	}
	tests := map[Role][]check{
		RoleActor: {
			{pub, "rl.x.data.insert", true},
			{sub, "rl.x.applied", true},
			// Rejections come to its own inbox (others' are in common).
			{sub, "_INBOX.u.notice", true},
			{sub, "rl.x.rejected.0123abcd", false},
			{pub, "$JS.API.STREAM.INFO." + stream, true},
			{sub, "rl.x.data.>", false},
			{sub, "rl.x.data.insert", false},
			{sub, "rl.x.>", false},
			{pub, "rl.x.data.reset", false},
			{pub, "rl.x.data.mutate", false},
			{pub, "rl.x.api.sample", false},
			{pub, "rl.x.api.info", true}, // sizes and signatures, for checking items before sending
			{pub, "rl.x.api.reset", false},
			{pub, "rl.x.api.checkpoint", false},
			{pub, "rl.x.applied", false},
			{pub, "$JS.API.STREAM.UPDATE." + stream, false},
			{pub, "$JS.API.STREAM.CREATE." + stream, false},
			{pub, "$JS.API.STREAM.DELETE." + stream, false},
			{pub, "$JS.API.STREAM.PURGE." + stream, false},
			{pub, "$JS.API.STREAM.MSG.GET." + stream, false},
			{pub, "$JS.API.DIRECT.GET." + stream, false},
			{pub, "$JS.API.DIRECT.GET." + stream + ".rl.x.data.insert", false},
			{pub, "$JS.API.CONSUMER.CREATE." + stream, false},
			{pub, "$JS.API.CONSUMER.CREATE." + stream + ".c.rl.x.data.>", false},
			{pub, "$JS.API.CONSUMER.DURABLE.CREATE." + stream + ".c", false},
			{pub, "$JS.API.STREAM.DELETE." + objects, false},
			{pub, "$JS.API.CONSUMER.CREATE." + objects, false},
			{pub, "$O." + bucket + ".M.x", false},
			{pub, "$KV.x.y", false},
			{pub, "$SRV.PING", false},
		},
		RoleLearner: {
			{pub, "rl.x.api.sample", true},
			{pub, "rl.x.api.info", true},
			{pub, "rl.x.api.items", true},
			{pub, "rl.x.data.mutate", true},
			{sub, "rl.x.applied", true},
			{pub, "rl.x.data.insert", false},
			{pub, "rl.x.data.reset", false},
			{pub, "rl.x.api.reset", false},
			{pub, "rl.x.api.checkpoint", false},
			{sub, "rl.x.data.>", false},
			{sub, "rl.x.data.mutate", false},
			{sub, "rl.x.rejected.*", false},
			{pub, "$JS.API.STREAM.INFO." + stream, false},
			{pub, "$JS.API.STREAM.DELETE." + stream, false},
			{pub, "$JS.API.CONSUMER.CREATE." + stream, false},
			{pub, "$JS.API.DIRECT.GET." + stream, false},
			{pub, "$JS.API.STREAM.DELETE." + objects, false},
		},
		RoleAdmin: {
			{pub, "rl.x.api.reset", true},
			{pub, "rl.x.api.checkpoint", true},
			{pub, "rl.x.api.sample", true},
			{pub, "rl.x.data.reset", true},
			{pub, "rl.x.data.insert", true},
			{pub, "rl.x.data.mutate", true},
			{sub, "rl.x.data.>", true},
			{sub, "rl.x.applied", true},
			{pub, "$JS.API.INFO", true},
			{pub, "$JS.API.STREAM.INFO." + stream, true},
			{pub, "$JS.API.STREAM.UPDATE." + stream, true},
			{pub, "$JS.API.STREAM.DELETE." + stream, true},
			{pub, "$JS.API.STREAM.PURGE." + stream, true},
			{pub, "$JS.API.STREAM.MSG.GET." + stream, true},
			{pub, "$JS.API.STREAM.MSG.DELETE." + stream, true},
			{pub, "$JS.API.DIRECT.GET." + stream, true},
			{pub, "$JS.API.CONSUMER.CREATE." + stream + ".c.rl.x.data.>", true},
			{pub, "$JS.API.CONSUMER.DURABLE.CREATE." + stream + ".c", true},
			{pub, "$JS.API.CONSUMER.MSG.NEXT." + stream + ".c", true},
			{pub, "$JS.API.CONSUMER.DELETE." + stream + ".c", true},
			{pub, "$JS.ACK." + stream + ".c.1.2.3.4.5", true},
			{pub, "$JS.API.STREAM.DELETE." + objects, true},
			{pub, "$JS.API.STREAM.INFO." + objects, true},
			{pub, "$O." + bucket + ".C.x", true},
			{pub, "$SRV.PING", true},
			{pub, "rl.y.api.reset", false},
		},
		RoleService: {
			{sub, "rl.x.api.checkpoint", true},
			{sub, "$SRV.INFO.reprise", true},
			{pub, "rl.x.applied", true},
			{pub, "_INBOX.actor.notice", true},
			{pub, "rl.x.rejected.0123abcd", false},
			{pub, "rl.x.data.reset", true},
			{pub, "rl.x.api.info", true},
			{pub, "_INBOX.learner.abc.1", true},
			{pub, "$JS.API.INFO", true},
			{pub, "$JS.API.STREAM.CREATE." + stream, true},
			{pub, "$JS.API.STREAM.UPDATE." + stream, true},
			{pub, "$JS.API.STREAM.PURGE." + stream, true},
			{pub, "$JS.API.CONSUMER.CREATE." + stream + ".c.rl.x.data.>", true},
			{pub, "$JS.API.CONSUMER.MSG.NEXT." + stream + ".c", true},
			{pub, "$JS.API.STREAM.CREATE." + objects, true},
			{pub, "$JS.API.DIRECT.GET." + objects + ".$O." + bucket + ".M.x", true},
			{pub, "$JS.API.STREAM.MSG.GET." + objects, true},
			{pub, "$JS.API.CONSUMER.CREATE." + objects + ".c.$O." + bucket + ".C.x", true},
			{pub, "$JS.FC." + objects + ".c.1", true},
			{pub, "$JS.FC.dom.hash." + objects + ".c.1", true},
			{pub, "$O." + bucket + ".C.x", true},
			{pub, "$O." + bucket + ".M.x", true},
			{pub, "rl.x.data.insert", false},
			{pub, "rl.x.data.mutate", false},
			{pub, "rl.x.api.sample", false},
			{sub, "rl.x.data.>", false},
			{sub, "rl.x.applied", false},
		},
	}
	for _, role := range Roles() {
		t.Run(string(role), func(t *testing.T) {
			perms, err := RolePermissions(role, "rl.x", "u")
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range append(tests[role], common(role)...) {
				rules := perms.Publish
				if c.op == sub {
					rules = perms.Subscribe
				}
				if got := allowed(rules, c.subject); got != c.want {
					t.Errorf("%s %s: allowed = %t, want %t", c.op, c.subject, got, c.want)
				}
			}
		})
	}
}

func TestRolePermissionsErrors(t *testing.T) {
	for _, tt := range []struct {
		role         Role
		prefix, user string
		want         error
	}{
		{"observer", "p", "u", ErrUnknownRole},
		{RoleActor, "p.>", "u", ErrInvalidPrefix},
		{RoleActor, "p", "", ErrInvalidUser},
		{RoleActor, "p", "a.b", ErrInvalidUser},
		{RoleActor, "p", "a b", ErrInvalidUser},
		{RoleActor, "p", "*", ErrInvalidUser},
		{RoleActor, "p", ">", ErrInvalidUser},
	} {
		if _, err := RolePermissions(tt.role, tt.prefix, tt.user); !errors.Is(err, tt.want) {
			t.Errorf("RolePermissions(%q, %q, %q) = %v, want %v", tt.role, tt.prefix, tt.user, err, tt.want)
		}
	}
	for _, r := range Roles() {
		if got, err := ParseRole(string(r)); err != nil || got != r {
			t.Errorf("ParseRole(%q) = %q, %v", r, got, err)
		}
		if strings.HasPrefix(r.Describe(), "unknown") {
			t.Errorf("role %q has no description", r)
		}
	}
}

func TestInboxPrefixIsPerUser(t *testing.T) {
	a, err := RolePermissions(RoleLearner, "p", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if !allowed(a.Subscribe, InboxPrefix("alice")+".x.1") {
		t.Errorf("alice may not read her own inbox %s", InboxPrefix("alice"))
	}
	if allowed(a.Subscribe, InboxPrefix("alicia")+".x.1") || allowed(a.Subscribe, InboxPrefix("bob")+".x.1") {
		t.Error("alice may read another user's inbox")
	}
}

// roleServer is an embedded NATS server with one password user per role,
// named after the role.
type roleServer struct {
	t      *testing.T
	url    string
	prefix string
}

func startRoleServer(t *testing.T, prefix string) *roleServer {
	t.Helper()
	return startShardedRoleServer(t, prefix)
}

// startShardedRoleServer gives each role the permissions of every prefix.
func startShardedRoleServer(t *testing.T, prefixes ...string) *roleServer {
	t.Helper()
	prefix := prefixes[0]
	opts := []embeddednats.Option{
		embeddednats.WithStoreDir(t.TempDir()), embeddednats.WithListen("127.0.0.1:-1"),
		embeddednats.WithLogger(testutil.QuietLogger()),
		// Sample replies larger than this travel in parts; object store
		// chunks (128 KiB) still fit.
		embeddednats.WithMaxPayload(256 << 10),
	}
	for _, role := range Roles() {
		p, err := ShardedRolePermissions(role, prefixes, string(role))
		if err != nil {
			t.Fatal(err)
		}
		perms := embeddednats.Permissions{
			Publish:   embeddednats.SubjectPermissions{Allow: p.Publish.Allow, Deny: p.Publish.Deny},
			Subscribe: embeddednats.SubjectPermissions{Allow: p.Subscribe.Allow, Deny: p.Subscribe.Deny},
		}
		opts = append(opts, embeddednats.WithUser(string(role), "pw-"+string(role), perms))
	}
	srv, err := embeddednats.Start(testutil.Context(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return &roleServer{t: t, url: srv.ClientURL(), prefix: prefix}
}

// violations records the permissions violations the server reports to a
// connection.
type violations struct {
	mu   sync.Mutex
	errs []string
}

func (v *violations) add(err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.errs = append(v.errs, err.Error())
}

func (v *violations) list() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.errs)
}

// has waits until a violation naming subject has been reported.
func (v *violations) has(t *testing.T, subject string) {
	t.Helper()
	testutil.WaitUntil(t, "a permissions violation for "+subject, func() bool {
		return slices.ContainsFunc(v.list(), func(e string) bool { return strings.Contains(e, `"`+subject+`"`) })
	})
}

func (s *roleServer) connect(role Role) (*nats.Conn, *violations) {
	s.t.Helper()
	v := &violations{}
	nc, err := nats.Connect(s.url, nats.UserInfo(string(role), "pw-"+string(role)), nats.CustomInboxPrefix(InboxPrefix(string(role))),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				v.add(err)
			}
		}))
	if err != nil {
		s.t.Fatalf("connecting as %s: %v", role, err)
	}
	s.t.Cleanup(nc.Close)
	return nc, v
}

// TestRolesOnAServer runs the data path with each part connected as its
// role: the service as service (creating the stream, checkpointing to the
// object store, recovering from it, replying in parts), an actor, a
// learner and an admin. None of them meets a permissions violation doing
// its job, and each is refused what its role forbids.
func TestRolesOnAServer(t *testing.T) {
	const prefix = "roles"
	s := startRoleServer(t, prefix)
	ctx := testutil.Context(t)
	cfgs := []tables.Config{testutil.UniformTable("t", 10000)}

	svcConn, svcViolations := s.connect(RoleService)
	runService := func() func() {
		svc, err := service.New(svcConn, cfgs, service.WithPrefix(prefix), service.WithLogger(testutil.QuietLogger()), service.WithObjectStoreCheckpoints())
		if err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- svc.Run(sctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("service: %v", err)
			}
		}
	}
	stop := runService()

	// The actor inserts 200 items of 4 KiB.
	actorConn, actorViolations := s.connect(RoleActor)
	p, err := NewProducer(ctx, actorConn, WithPrefix(prefix), WithLogger(testutil.QuietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	for i := range int64(200) {
		if err := p.Append(ctx, step(i, 1024)); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", 1, LastStep("obs", "id")); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}

	// The learner samples 100 items (400 KiB: a reply in parts) and
	// updates a priority.
	learnerConn, learnerViolations := s.connect(RoleLearner)
	learner, err := NewClient(learnerConn, WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer learner.Close()
	batch, err := learner.Sample(ctx, "t", 100)
	if err != nil {
		t.Fatalf("learner sampling: %v", err)
	}
	checkObs(t, batch[0], 1024)
	if err := learner.UpdatePriorities(ctx, "t", tables.PriorityUpdate{Key: batch[0].Info.Key, Priority: 7}); err != nil {
		t.Fatalf("learner updating a priority: %v", err)
	}

	// The admin checkpoints; the service restarts from the checkpoint.
	adminConn, adminViolations := s.connect(RoleAdmin)
	admin, err := NewClient(adminConn, WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Checkpoint(ctx); err != nil {
		t.Fatalf("admin checkpoint: %v", err)
	}
	stop()
	stop = runService()
	defer func() { stop() }()
	testutil.WaitUntil(t, "the restarted service answers", func() bool {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		info, err := learner.Info(rctx, "t")
		return err == nil && info.Tables[0].Size == 200
	})
	got, err := learner.Get(ctx, "t", batch[0].Info.Key)
	if err != nil || len(got.Items) != 1 || got.Items[0].Priority != 7 {
		t.Fatalf("after recovery, the updated item = %v, %v; want priority 7", got, err)
	}

	for role, v := range map[Role]*violations{RoleService: svcViolations, RoleActor: actorViolations, RoleLearner: learnerViolations, RoleAdmin: adminViolations} {
		if errs := v.list(); len(errs) > 0 {
			t.Errorf("%s met permissions violations doing its job: %v", role, errs)
		}
	}

	// What each role may not do.
	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		t.Cleanup(cancel)
		return c
	}
	actorConn.SubscribeSync(prefix + ".data.>")
	actorViolations.has(t, prefix+".data.>")
	actorConn.SubscribeSync(prefix + ".api.sample")
	actorViolations.has(t, prefix+".api.sample")
	actorConn.Publish(prefix+".data.reset", nil)
	actorViolations.has(t, prefix+".data.reset")
	actorConn.Publish(prefix+".data.mutate", []byte("x"))
	actorViolations.has(t, prefix+".data.mutate")
	actorJS, _ := jetstream.New(actorConn)
	if err := actorJS.DeleteStream(short(), "REPRISE_ROLES"); err == nil {
		t.Error("the actor deleted the stream")
	}
	actorViolations.has(t, "$JS.API.STREAM.DELETE.REPRISE_ROLES")
	if _, err := actorJS.OrderedConsumer(short(), "REPRISE_ROLES", jetstream.OrderedConsumerConfig{}); err == nil {
		t.Error("the actor read the stream through a consumer")
	}
	if err := actorJS.DeleteObjectStore(short(), "REPRISE_ROLES_CHECKPOINTS"); err == nil {
		t.Error("the actor deleted the checkpoint bucket")
	}
	actorClient, err := NewClient(actorConn, WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer actorClient.Close()
	if _, err := actorClient.Sample(short(), "t", 1); err == nil {
		t.Error("the actor sampled")
	}
	actorViolations.has(t, prefix+".api.sample")

	if err := learner.Reset(short(), "t"); err == nil {
		t.Error("the learner reset a table")
	}
	learnerViolations.has(t, prefix+".api.reset")
	if _, err := learner.Checkpoint(short()); err == nil {
		t.Error("the learner wrote a checkpoint")
	}
	learnerViolations.has(t, prefix+".api.checkpoint")
	learnerConn.Publish(prefix+".data.insert", []byte("x"))
	learnerViolations.has(t, prefix+".data.insert")
	learnerConn.SubscribeSync(prefix + ".data.>")
	learnerViolations.has(t, prefix+".data.>")
	if _, err := NewProducer(short(), learnerConn, WithPrefix(prefix), WithLogger(testutil.QuietLogger())); err == nil {
		t.Error("the learner made a producer")
	}

	adminConn.SubscribeSync(prefix + ".api.sample")
	adminViolations.has(t, prefix+".api.sample")
	if err := admin.Reset(ctx, "t"); err != nil {
		t.Fatalf("admin reset: %v", err)
	}
	adminJS, _ := jetstream.New(adminConn)
	if _, err := adminJS.Stream(ctx, "REPRISE_ROLES"); err != nil {
		t.Errorf("the admin cannot read the stream's info: %v", err)
	}

	if errs := svcViolations.list(); len(errs) > 0 {
		t.Errorf("the service met permissions violations doing its job: %v", errs)
	}
}

// TestShardedRolesOnAServer: with each role's permissions over both shards'
// prefixes, two shard services, a sharded producer and a sharded client do
// their jobs without a permissions violation, and the learner still may not
// reset.
func TestShardedRolesOnAServer(t *testing.T) {
	prefixes := []string{"rs0", "rs1"}
	s := startShardedRoleServer(t, prefixes...)
	ctx := testutil.Context(t)
	cfgs := []tables.Config{testutil.UniformTable("t", 1000)}
	svcConn, svcViolations := s.connect(RoleService)
	for i, prefix := range prefixes {
		svc, err := service.New(svcConn, cfgs, service.WithPrefix(prefix), service.WithLogger(testutil.QuietLogger()),
			service.WithObjectStoreCheckpoints(), service.WithShard(service.Shard{Index: i, Count: len(prefixes)}))
		if err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- svc.Run(sctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("service %s: %v", prefix, err)
			}
		})
	}
	actorConn, actorViolations := s.connect(RoleActor)
	p, err := NewShardedProducer(ctx, actorConn, prefixes, WithLogger(testutil.QuietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	for e := range int64(4) {
		if err := p.Append(ctx, step(e, 8)); err != nil {
			t.Fatal(err)
		}
		if err := p.CreateItem(ctx, "t", 1, LastStep("obs", "id")); err != nil {
			t.Fatal(err)
		}
		if err := p.EndEpisode(ctx); err != nil {
			t.Fatal(err)
		}
	}
	learnerConn, learnerViolations := s.connect(RoleLearner)
	learner, err := NewShardedClient(learnerConn, prefixes)
	if err != nil {
		t.Fatal(err)
	}
	defer learner.Close()
	batch, err := learner.Sample(ctx, "t", 16)
	if err != nil {
		t.Fatalf("learner sampling: %v", err)
	}
	if err := learner.UpdatePriorities(ctx, "t", tables.PriorityUpdate{Key: batch[0].Info.Key, Priority: 3}); err != nil {
		t.Fatalf("learner updating a priority: %v", err)
	}
	if info, err := learner.Info(ctx, "t"); err != nil || info.Tables[0].Size != 4 || info.Shards[0].Tables[0].Size != 2 {
		t.Fatalf("learner info: %+v, %v; want 4 items, 2 on each shard", info, err)
	}
	for role, v := range map[Role]*violations{RoleService: svcViolations, RoleActor: actorViolations, RoleLearner: learnerViolations} {
		if errs := v.list(); len(errs) > 0 {
			t.Errorf("%s met permissions violations doing its job: %v", role, errs)
		}
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := learner.Reset(short, "t"); err == nil {
		t.Error("the learner reset the table")
	}
	learnerViolations.has(t, "rs1.api.reset")
}
