package broker

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/reprise-rl/reprise/broker/internal/protocol"
)

// Role is what a NATS user may do in one deployment (one prefix). The NATS
// server enforces it: a role is a set of subject permissions, and a client
// that publishes or subscribes outside them gets a permissions violation
// from the server, never an answer from Reprise.
type Role string

// The roles of a deployment.
const (
	// RoleActor publishes inserts and reads what it needs to pace them:
	// the service's applied progress and its own rejections (in its inbox). It cannot read
	// data, mutate, reset, or touch the stream beyond asking whether it
	// exists.
	RoleActor Role = "actor"
	// RoleLearner samples, lists items, reads info and updates priorities
	// or deletes items (mutations, through the stream). It cannot insert,
	// reset, checkpoint or manage the stream.
	RoleLearner Role = "learner"
	// RoleAdmin may do everything for its prefix except serve requests in
	// the service's place: reset, checkpoint, insert, mutate, and manage
	// the stream and the checkpoint bucket.
	RoleAdmin Role = "admin"
	// RoleService is the table service (reprised) itself: it owns the
	// stream, the checkpoint bucket and the lease bucket (standby
	// services), serves the request protocol.Subjects and publishes
	// progress, rejections and resets.
	RoleService Role = "service"
)

// Roles lists every role, in the order the documentation gives them.
func Roles() []Role { return []Role{RoleActor, RoleLearner, RoleAdmin, RoleService} }

// Errors of the role functions. Match them with errors.Is.
var (
	ErrUnknownRole = errors.New("broker: unknown role")
	ErrInvalidUser = errors.New("broker: invalid user name")
)

// ParseRole returns the role named s.
func ParseRole(s string) (Role, error) {
	r := Role(s)
	if !slices.Contains(Roles(), r) {
		return "", fmt.Errorf("%w %q: want actor, learner, admin or service", ErrUnknownRole, s)
	}
	return r, nil
}

// Describe says in a line what the role may do.
func (r Role) Describe() string {
	switch r {
	case RoleActor:
		return "publishes inserts; reads applied progress, its rejections and table info; waits for the stream"
	case RoleLearner:
		return "samples, lists items, reads info; updates priorities and deletes items"
	case RoleAdmin:
		return "everything for the prefix (reset, checkpoint, stream and bucket management) except serving requests"
	case RoleService:
		return "the table service (reprised): owns the stream and the checkpoint bucket, serves the requests"
	}
	return "unknown role"
}

// SubjectRules are NATS subject patterns a user may use (Allow) and may
// not (Deny); Deny wins where both match.
type SubjectRules struct {
	Allow []string
	Deny  []string
}

// Permissions are what a user may publish and subscribe to.
type Permissions struct {
	Publish   SubjectRules
	Subscribe SubjectRules
}

// InboxPrefix is where user's replies arrive: its connections must use it
// (nats.CustomInboxPrefix(InboxPrefix(user))). NATS does not keep replies
// private: any client allowed to subscribe to a reply subject receives what
// is sent there, and the default inboxes all live under _INBOX.>, where the
// table service's stream deliveries and learners' samples arrive too. So
// each user may subscribe to its own inbox only, and only the service may
// publish replies, so that no client reads or forges another's.
func InboxPrefix(user string) string { return "_INBOX." + user }

// CheckUser checks that user can name an inbox: one subject token, without
// dots, spaces or wildcards (with a dot, one user's inbox would contain
// another's).
func CheckUser(user string) error {
	if user == "" || strings.ContainsAny(user, ". \t\r\n*>") {
		return fmt.Errorf("%w %q: want one word without dots, spaces, * or > (it names the user's reply inbox %s.<user>)", ErrInvalidUser, user, InboxPrefix(""))
	}
	return nil
}

// RolePermissions returns what user, holding role in the deployment with
// the given subject prefix, may publish and subscribe to. user names the
// user's inbox (InboxPrefix); for an nkey user it is the public key.
func RolePermissions(role Role, prefix, user string) (Permissions, error) {
	subj, err := protocol.NewSubjects(prefix)
	if err != nil {
		return Permissions{}, err
	}
	if _, err := ParseRole(string(role)); err != nil {
		return Permissions{}, err
	}
	if err := CheckUser(user); err != nil {
		return Permissions{}, err
	}
	var (
		inbox  = InboxPrefix(user) + ".>"
		all    = subj.Prefix + ".>"
		api    = subj.APIGroup() + ".>"
		stream = subj.Stream()
	)
	objects := objectStoreStream(subj.CheckpointBucket())
	lease := kvStream(subj.LeaseBucket())
	var p Permissions
	switch role {
	case RoleActor:
		// Info (table names, sizes and signatures, no data) lets an actor
		// check an item against its table's signature before sending it.
		p.Publish.Allow = []string{subj.Insert(), subj.Info(), streamInfoAPI(stream)}
		// Rejections arrive in the producer's inbox, which no other user
		// may read.
		p.Subscribe.Allow = []string{subj.Applied(), inbox}
	case RoleLearner:
		p.Publish.Allow = []string{subj.Sample(), subj.Info(), subj.Items(), subj.Mutate()}
		p.Subscribe.Allow = []string{subj.Applied(), inbox}
	case RoleAdmin:
		p.Publish.Allow = slices.Concat(
			[]string{all, accountInfoAPI, microDiscovery},
			streamAPI(stream), streamAPI(objects), streamAPI(lease),
			consumerReplies(stream), consumerReplies(objects),
			[]string{objectStoreSubjects(subj.CheckpointBucket()), kvSubjects(subj.LeaseBucket())})
		p.Subscribe.Allow = []string{all, inbox}
		p.Subscribe.Deny = []string{api}
	case RoleService:
		p.Publish.Allow = slices.Concat(
			[]string{subj.Reset(), subj.Applied(), subj.Info(), subj.Standby(), accountInfoAPI},
			streamAPI(stream), streamAPI(objects), streamAPI(lease),
			consumerReplies(stream), consumerReplies(objects),
			[]string{objectStoreSubjects(subj.CheckpointBucket()), kvSubjects(subj.LeaseBucket()), anyInbox})
		p.Subscribe.Allow = []string{api, microDiscovery, inbox}
	}
	return p, nil
}

// ShardedRolePermissions returns what user, holding role in a sharded
// table whose shards have the given prefixes, may publish and subscribe
// to: what the role may do on every shard. A sharded producer and client
// reach every shard, so an actor or learner needs all of them; the
// services of the shards may share one service user, or each have one
// with RolePermissions for its own prefix.
func ShardedRolePermissions(role Role, prefixes []string, user string) (Permissions, error) {
	if len(prefixes) == 0 {
		return Permissions{}, fmt.Errorf("%w: no prefix given", ErrInvalidPrefix)
	}
	var out Permissions
	for _, prefix := range prefixes {
		p, err := RolePermissions(role, prefix, user)
		if err != nil {
			return Permissions{}, err
		}
		out.Publish.Allow = appendNew(out.Publish.Allow, p.Publish.Allow...)
		out.Publish.Deny = appendNew(out.Publish.Deny, p.Publish.Deny...)
		out.Subscribe.Allow = appendNew(out.Subscribe.Allow, p.Subscribe.Allow...)
		out.Subscribe.Deny = appendNew(out.Subscribe.Deny, p.Subscribe.Deny...)
	}
	return out, nil
}

// appendNew appends the subjects list does not hold yet.
func appendNew(list []string, subjects ...string) []string {
	for _, s := range subjects {
		if !slices.Contains(list, s) {
			list = append(list, s)
		}
	}
	return list
}

// Subjects outside the prefix that roles use: JetStream's API, NATS micro
// discovery (nats micro ls), and every inbox, to which only the service
// publishes (its replies; the server sends JetStream's own without
// permission checks). The service could instead be given allow_responses,
// but that permits a fixed number of messages per request, and a sample
// reply larger than the max payload travels in several.
const (
	accountInfoAPI = "$JS.API.INFO"
	microDiscovery = "$SRV.>"
	anyInbox       = "_INBOX.>"
)

// streamInfoAPI is the JetStream request that reads a stream's
// configuration and state (not its messages).
func streamInfoAPI(stream string) string { return "$JS.API.STREAM.INFO." + stream }

// streamAPI is every JetStream API request on one stream and its consumers.
// Each pattern ends in the stream name or names it at a fixed place, so
// that no other stream matches: "$JS.API.CONSUMER.*.*.<stream>.*" would
// also match creating a consumer named <stream> on another stream.
func streamAPI(stream string) []string {
	return []string{
		"$JS.API.STREAM.*." + stream,   // CREATE, UPDATE, INFO, DELETE, PURGE, SNAPSHOT, RESTORE
		"$JS.API.STREAM.*.*." + stream, // MSG.GET, MSG.DELETE, LEADER.STEPDOWN, PEER.REMOVE
		"$JS.API.DIRECT.GET." + stream,
		"$JS.API.DIRECT.GET." + stream + ".>",
		"$JS.API.CONSUMER.*." + stream,        // CREATE, NAMES, LIST
		"$JS.API.CONSUMER.*." + stream + ".>", // CREATE (named), INFO, DELETE, PAUSE, UNPIN, RESET
		"$JS.API.CONSUMER.DURABLE.CREATE." + stream + ".*",
		"$JS.API.CONSUMER.MSG.NEXT." + stream + ".*",
		"$JS.API.CONSUMER.LEADER.STEPDOWN." + stream + ".*",
	}
}

// consumerReplies are the protocol.Subjects a consumer of the stream acknowledges
// messages and answers flow control on, in the server's two formats
// ($JS.ACK.<stream>.… and $JS.ACK.<domain>.<account hash>.<stream>.…).
// The object store reads objects through a flow-controlled consumer.
func consumerReplies(stream string) []string {
	return []string{
		"$JS.ACK." + stream + ".>",
		"$JS.ACK.*.*." + stream + ".>",
		"$JS.FC." + stream + ".>",
		"$JS.FC.*.*." + stream + ".>",
	}
}

// objectStoreStream is the stream behind an object store bucket, and
// objectStoreSubjects the protocol.Subjects its chunks and metadata are published
// on.
func objectStoreStream(bucket string) string   { return "OBJ_" + bucket }
func objectStoreSubjects(bucket string) string { return "$O." + bucket + ".>" }

// kvStream is the stream behind a KV bucket (the lease's), and kvSubjects
// the subjects its keys are written on.
func kvStream(bucket string) string   { return "KV_" + bucket }
func kvSubjects(bucket string) string { return "$KV." + bucket + ".>" }
