package broker

import (
	"errors"
	"slices"
	"strings"
	"testing"
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
		}
	}
	tests := map[Role][]check{
		RoleActor: {
			{pub, "rl.x.data.insert", true},
			{sub, "rl.x.applied", true},
			{sub, "rl.x.rejected.0123abcd", true},
			{pub, "$JS.API.STREAM.INFO." + stream, true},
			{sub, "rl.x.data.>", false},
			{sub, "rl.x.data.insert", false},
			{sub, "rl.x.>", false},
			{pub, "rl.x.data.reset", false},
			{pub, "rl.x.data.mutate", false},
			{pub, "rl.x.api.sample", false},
			{pub, "rl.x.api.info", false},
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
			{pub, "rl.x.rejected.0123abcd", true},
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
