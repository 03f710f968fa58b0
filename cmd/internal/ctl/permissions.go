package ctl

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/nats-io/nkeys"

	"github.com/reprise-rl/reprise/broker"
	"github.com/reprise-rl/reprise/cmd/internal/cli"
	"github.com/reprise-rl/reprise/cmd/internal/config"
)

const permissionsAbout = `Prints an authorization block for nats-server's configuration file: one
user per role (or only --role) with the subject permissions of that role in
the deployment with --prefix. Paste it into the configuration of an
external NATS server, replace the password placeholders, and connect
reprised as the service user (reprised --nats URL --user service).

For a sharded table give --prefix once per shard: each user then holds its
role on every shard, as a sharded producer or client needs.

The roles: actor (inserts), learner (samples, priorities, info), admin
(everything for the prefix except serving requests), service (reprised).
Each user reads replies only under its own inbox, _INBOX.<user>: the tools
of this repository derive it from --user or --nkey; other clients set it
(nats --inbox-prefix _INBOX.<user>).
`

// authUser is one user of the printed block.
type authUser struct {
	role broker.Role
	id   string // the user's name, or its nkey's public key
	nkey bool
}

func runPermissions(_ context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		role, user, nkey string
		prefixes         []string
	)
	fs := newFlagSet("permissions", "permissions [flags]", permissionsAbout, stderr)
	fs.Func("prefix", "subject `prefix` of the deployment, as given to reprised; repeat it for each shard of a sharded table (default "+broker.DefaultPrefix+")", func(v string) error {
		if err := config.CheckPrefix(v); err != nil {
			return err
		}
		prefixes = append(prefixes, v)
		return nil
	})
	fs.StringVar(&role, "role", "", "print only this `role`: actor, learner, admin or service (default: one user of each)")
	fs.StringVar(&user, "user", "", "user `name` (with --role; default: the role's name)")
	fs.StringVar(&nkey, "nkey", "", "identify the user by this nkey `public key` (U...) instead of a name and password (with --role)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return cli.Usagef("permissions takes no arguments, got %q", pos)
	}
	if len(prefixes) == 0 {
		prefixes = []string{broker.DefaultPrefix}
	}
	roles := broker.Roles()
	if role != "" {
		r, err := broker.ParseRole(role)
		if err != nil {
			return cli.Usagef("--role: %v", err)
		}
		roles = []broker.Role{r}
	}
	if (user != "" || nkey != "") && role == "" {
		return cli.Usagef("--user and --nkey name one user: add --role")
	}
	if user != "" && nkey != "" {
		return cli.Usagef("--user and --nkey are two ways to identify the user: give one")
	}
	if nkey != "" && !nkeys.IsValidPublicUserKey(nkey) {
		return cli.Usagef("--nkey %q is not the public key of a user nkey (it starts with U; the seed, SU..., stays with the client)", nkey)
	}
	var users []authUser
	for _, r := range roles {
		u := authUser{role: r, id: string(r)}
		switch {
		case nkey != "":
			u.id, u.nkey = nkey, true
		case user != "":
			u.id = user
		}
		users = append(users, u)
	}
	return writeAuthorization(stdout, prefixes, users)
}

// writeAuthorization prints users with their roles' permissions as a
// nats-server authorization block.
func writeAuthorization(w io.Writer, prefixes []string, users []authUser) error {
	var b strings.Builder
	if len(prefixes) == 1 {
		fmt.Fprintf(&b, "# Reprise roles for the deployment with prefix %q (reprisectl permissions).\n", prefixes[0])
	} else {
		fmt.Fprintf(&b, "# Reprise roles for the table sharded over prefixes %q (reprisectl permissions).\n", prefixes)
	}
	b.WriteString("# Replace each password placeholder with the user's password, or better its\n")
	b.WriteString("# bcrypt hash (nats server passwd). A user reads replies only under\n")
	b.WriteString("# _INBOX.<user>: rename a user in both places, and connect its clients\n")
	b.WriteString("# with --user (or nats --inbox-prefix _INBOX.<user>).\n")
	b.WriteString("authorization {\n  users = [\n")
	for _, u := range users {
		p, err := broker.ShardedRolePermissions(u.role, prefixes, u.id)
		if err != nil {
			return cli.Usagef("%v", err)
		}
		fmt.Fprintf(&b, "    # %s: %s\n    {\n", u.role, u.role.Describe())
		if u.nkey {
			fmt.Fprintf(&b, "      nkey: %s\n", strconv.Quote(u.id))
		} else {
			fmt.Fprintf(&b, "      user: %s\n", strconv.Quote(u.id))
			fmt.Fprintf(&b, "      password: %s\n", strconv.Quote(strings.ToUpper(string(u.role))+"_PASSWORD"))
		}
		b.WriteString("      permissions: {\n")
		writeRules(&b, "publish", p.Publish)
		writeRules(&b, "subscribe", p.Subscribe)
		b.WriteString("      }\n    }\n")
	}
	b.WriteString("  ]\n}\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func writeRules(b *strings.Builder, name string, r broker.SubjectRules) {
	fmt.Fprintf(b, "        %s: {\n", name)
	for _, list := range []struct {
		key      string
		subjects []string
	}{{"allow", r.Allow}, {"deny", r.Deny}} {
		if len(list.subjects) == 0 {
			continue
		}
		quoted := make([]string, len(list.subjects))
		for i, s := range list.subjects {
			quoted[i] = strconv.Quote(s)
		}
		fmt.Fprintf(b, "          %s: [\n            %s\n          ]\n", list.key, strings.Join(quoted, ",\n            "))
	}
	b.WriteString("        }\n")
}
