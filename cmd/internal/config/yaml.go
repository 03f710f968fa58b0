package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Error is one problem in a configuration file, at a line, under a key such
// as tables[1].rate_limiter.min_size.
type Error struct {
	File string
	Line int
	Key  string
	Err  error
}

func (e *Error) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err)
	}
	return fmt.Sprintf("%s:%d: %s: %v", e.File, e.Line, e.Key, e.Err)
}

// Unwrap gives ErrInvalid and the underlying error, so that errors.Is
// matches both (e.g. limiter.ErrInvalidConfig).
func (e *Error) Unwrap() []error { return []error{ErrInvalid, e.Err} }

// parser walks the YAML node tree, decoding values where it knows the key
// and collecting one Error per problem, so that a user sees every mistake
// of a file at once.
type parser struct {
	file string
	errs []*Error
}

func (p *parser) fail(n *yaml.Node, key string, err error) {
	p.errs = append(p.errs, &Error{File: p.file, Line: n.Line, Key: key, Err: err})
}

func (p *parser) failf(n *yaml.Node, key, format string, args ...any) {
	p.fail(n, key, fmt.Errorf(format, args...))
}

// field decodes the value of one key of a mapping.
type field struct {
	key    string
	decode func(n *yaml.Node, key string)
}

func keyNames(fields []field) []string {
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.key
	}
	return names
}

func joinKey(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

// resolve follows YAML aliases (*name) to the node they stand for.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// describe names a node's value for an error message.
func describe(n *yaml.Node) string {
	n = resolve(n)
	switch {
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null":
		return "nothing"
	case n.Kind == yaml.ScalarNode:
		return strconv.Quote(n.Value)
	}
	return "an unexpected node"
}

// describeHidden is describe without a scalar's value, for where one may
// be a password (a user written as "alice:secret").
func describeHidden(n *yaml.Node) string {
	if n = resolve(n); n.Kind == yaml.ScalarNode && n.ShortTag() != "!!null" {
		return "a single value (not shown: it may hold a password)"
	}
	return describe(n)
}

// mapping decodes the keys of a mapping with fields, reports unknown and
// repeated keys, and returns the value nodes of the keys present.
func (p *parser) mapping(n *yaml.Node, key string, fields []field) map[string]*yaml.Node {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		p.failf(n, key, "want a mapping with keys %s, got %s", strings.Join(keyNames(fields), ", "), describe(n))
		return nil
	}
	present := make(map[string]*yaml.Node)
	keyLines := make(map[string]int)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			p.failf(k, key, "a key must be a plain name, got %s", describe(k))
			continue
		}
		path := joinKey(key, k.Value)
		if k.ShortTag() == "!!merge" {
			p.failf(k, path, "YAML merge keys are not supported: write the keys out")
			continue
		}
		if line, dup := keyLines[k.Value]; dup {
			p.failf(k, path, "set twice (first at line %d): keep one", line)
			continue
		}
		keyLines[k.Value] = k.Line
		i := fieldIndex(fields, k.Value)
		if i < 0 {
			p.unknownKey(k, key, fields)
			continue
		}
		present[k.Value] = resolve(v)
		fields[i].decode(resolve(v), path)
	}
	return present
}

func fieldIndex(fields []field, key string) int {
	for i, f := range fields {
		if f.key == key {
			return i
		}
	}
	return -1
}

func (p *parser) unknownKey(k *yaml.Node, parent string, fields []field) {
	names := keyNames(fields)
	where := "here"
	if parent != "" {
		where = "in " + parent
	}
	if s := suggest(k.Value, names); s != "" {
		p.failf(k, joinKey(parent, k.Value), "unknown key: did you mean %q? (keys %s: %s)", s, where, strings.Join(names, ", "))
		return
	}
	p.failf(k, joinKey(parent, k.Value), "unknown key (keys %s: %s)", where, strings.Join(names, ", "))
}

// suggest returns the candidate closest to s when it is close enough to be
// a likely typo.
func suggest(s string, candidates []string) string {
	best, bestDist := "", len(s)/3+2
	for _, c := range candidates {
		if d := editDistance(s, c); d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// scalar checks that n is a single value, not a mapping, a list or nothing.
func (p *parser) scalar(n *yaml.Node, key, want string) bool {
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		p.failf(n, key, "want %s, got %s", want, describe(n))
		return false
	}
	// A value tagged !!binary, or with a tag of the writer's own, means
	// something else than its text, which is all that would be read.
	if tag := n.ShortTag(); n.Style&yaml.TaggedStyle != 0 && !slices.Contains(coreTags, tag) {
		p.failf(n, key, "the YAML tag %s is not supported: remove it (want %s)", tag, want)
		return false
	}
	return true
}

// coreTags are the tags of the values a configuration holds.
var coreTags = []string{"!!str", "!!int", "!!float", "!!bool"}

// str decodes a string, checked by check when it is not nil.
func (p *parser) str(dst *string, check func(string) error) func(*yaml.Node, string) {
	return func(n *yaml.Node, key string) {
		if !p.scalar(n, key, "a string") {
			return
		}
		if check != nil {
			if err := check(n.Value); err != nil {
				p.fail(n, key, err)
				return
			}
		}
		*dst = n.Value
	}
}

// node keeps the value node for decoding once its siblings are known.
func (p *parser) node(dst **yaml.Node) func(*yaml.Node, string) {
	return func(n *yaml.Node, _ string) { *dst = n }
}

// integer decodes a whole number in [lo, hi]. YAML writes 1e6 as a float,
// so a float that is a whole number counts too; 1.5 does not.
func (p *parser) integer(n *yaml.Node, key string, lo, hi int64, hint string) (int64, bool) {
	if !p.scalar(n, key, "a whole number") {
		return 0, false
	}
	outOfRange := func(above bool) (int64, bool) {
		switch {
		case hi != math.MaxInt64 && hi != math.MaxInt32:
			p.failf(n, key, "must be in [%d, %d], got %s%s", lo, hi, n.Value, hint)
		case above:
			p.failf(n, key, "must be <= %d, got %s%s", hi, n.Value, hint)
		default:
			p.failf(n, key, "must be >= %d, got %s%s", lo, n.Value, hint)
		}
		return 0, false
	}
	if !p.unambiguousNumber(n, key) {
		return 0, false
	}
	var v int64
	switch n.ShortTag() {
	case "!!int":
		if n.Decode(&v) != nil {
			return outOfRange(!strings.HasPrefix(n.Value, "-"))
		}
	case "!!float":
		var f float64
		if n.Decode(&f) != nil || f != math.Trunc(f) || math.IsInf(f, 0) {
			p.failf(n, key, "want a whole number, got %s", n.Value)
			return 0, false
		}
		// float64(math.MaxInt64) rounds up to 2^63, which int64 cannot hold.
		if above := f > float64(hi) || f >= 0x1p63; above || f < float64(lo) {
			return outOfRange(above)
		}
		v = int64(f)
	default:
		p.failf(n, key, "want a whole number, got %s", describe(n))
		return 0, false
	}
	if v < lo || v > hi {
		return outOfRange(v > hi)
	}
	return v, true
}

// leadingZero matches a whole number written with a leading 0, such as
// 010 or -0_10.
var leadingZero = regexp.MustCompile(`^[-+]?0[0-9_]+$`)

// unambiguousNumber refuses a whole number with a leading 0: the YAML
// library reads 010 as YAML 1.1's octal 8, where YAML 1.2 and most readers
// of the file see ten, and 09 as nine.
func (p *parser) unambiguousNumber(n *yaml.Node, key string) bool {
	if n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) == 0 && leadingZero.MatchString(n.Value) {
		p.failf(n, key, "%s has a leading 0, which YAML 1.1 reads as octal (010 is 8) and YAML 1.2 as decimal: write it without the leading 0, or with 0o for octal (0o10)", n.Value)
		return false
	}
	return true
}

// intInto decodes a whole number in [lo, hi] into dst; hint, when not
// empty, is appended to the error and says what to write instead.
func intInto[T int | int32 | int64](p *parser, dst *T, lo, hi int64, hint string) func(*yaml.Node, string) {
	return func(n *yaml.Node, key string) {
		if v, ok := p.integer(n, key, lo, hi, hint); ok {
			*dst = T(v)
		}
	}
}

// number decodes a number; YAML spells infinities .inf and -.inf. check,
// when not nil, says what is wrong with a value.
func (p *parser) number(dst *float64, check func(float64) error) func(*yaml.Node, string) {
	return func(n *yaml.Node, key string) {
		if !p.scalar(n, key, "a number") {
			return
		}
		if !p.unambiguousNumber(n, key) {
			return
		}
		var f float64
		if tag := n.ShortTag(); (tag != "!!int" && tag != "!!float") || n.Decode(&f) != nil {
			p.failf(n, key, "want a number, got %s", describe(n))
			return
		}
		if check != nil {
			if err := check(f); err != nil {
				p.fail(n, key, err)
				return
			}
		}
		*dst = f
	}
}

func finiteAtLeast(lo float64, strict bool) func(float64) error {
	return func(f float64) error {
		switch {
		case math.IsNaN(f) || math.IsInf(f, 0):
			return fmt.Errorf("want a finite number, got %v", f)
		case strict && f <= lo:
			return fmt.Errorf("must be > %v, got %v", lo, f)
		case !strict && f < lo:
			return fmt.Errorf("must be >= %v, got %v", lo, f)
		}
		return nil
	}
}

// boolean decodes true or false (and not YAML 1.1's yes, no, on, off).
func (p *parser) boolean(dst *bool) func(*yaml.Node, string) {
	return func(n *yaml.Node, key string) {
		if !p.scalar(n, key, "true or false") {
			return
		}
		if n.ShortTag() != "!!bool" || n.Decode(dst) != nil {
			p.failf(n, key, "want true or false, got %s", describe(n))
		}
	}
}

// duration decodes a Go duration such as 30s, 5m or 1h30m; 0 is allowed.
func (p *parser) duration(dst *time.Duration, positive bool) func(*yaml.Node, string) {
	return func(n *yaml.Node, key string) {
		if !p.scalar(n, key, "a duration such as 30s, 5m or 1h") {
			return
		}
		d, err := time.ParseDuration(n.Value)
		switch {
		case err != nil:
			p.failf(n, key, "want a duration such as 30s, 5m or 1h, got %s", describe(n))
		case d < 0 || (positive && d == 0):
			bound := ">= 0"
			if positive {
				bound = "> 0"
			}
			p.failf(n, key, "must be %s, got %s", bound, n.Value)
		default:
			*dst = d
		}
	}
}

// jetStreamMinDuration is the least age JetStream takes for a stream's
// max_age and duplicates window, and so for a KV bucket's TTL.
const jetStreamMinDuration = 100 * time.Millisecond

// jetStreamDuration decodes a duration JetStream takes: 0 (none, or the
// default) or at least jetStreamMinDuration.
func (p *parser) jetStreamDuration(dst *time.Duration) func(*yaml.Node, string) {
	decode := p.duration(dst, false)
	return func(n *yaml.Node, key string) {
		before := len(p.errs)
		decode(n, key)
		if len(p.errs) == before && *dst != 0 && *dst < jetStreamMinDuration {
			p.failf(n, key, "must be 0 or at least %v (JetStream refuses less), got %s", jetStreamMinDuration, n.Value)
		}
	}
}

// oneOf checks that a string is one of choices, suggesting the closest.
func oneOf(what string, choices ...string) func(string) error {
	return func(s string) error {
		for _, c := range choices {
			if s == c {
				return nil
			}
		}
		sorted := append([]string(nil), choices...)
		sort.Strings(sorted)
		if sug := suggest(s, choices); sug != "" {
			return fmt.Errorf("unknown %s %q: did you mean %q? (one of %s)", what, s, sug, strings.Join(sorted, ", "))
		}
		return fmt.Errorf("unknown %s %q (one of %s)", what, s, strings.Join(sorted, ", "))
	}
}

// decodeDocument parses data into its top-level node; an empty file is an
// empty mapping.
func decodeDocument(name string, data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	switch err := dec.Decode(&doc); {
	case errors.Is(err, io.EOF):
		return &yaml.Node{Kind: yaml.MappingNode, Line: 1}, nil
	case err != nil:
		return nil, syntaxError(name, data, err)
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		return nil, &Error{File: name, Line: max(next.Line, 1), Err: errors.New("a second YAML document (after ---): put everything in one")}
	}
	if len(doc.Content) == 0 || doc.Content[0].ShortTag() == "!!null" {
		return &yaml.Node{Kind: yaml.MappingNode, Line: 1}, nil
	}
	if doc.Kind != yaml.DocumentNode {
		return nil, errors.New("config: unexpected YAML structure")
	}
	return doc.Content[0], nil
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

// syntaxError turns the YAML parser's "yaml: line N: msg" into an Error at
// the line that makes the file unreadable, with the usual cause. The
// parser's N is where the enclosing list or mapping starts, or the line
// before it, for most mistakes of indentation.
func syntaxError(name string, data []byte, err error) error {
	msg := err.Error()
	line := 1
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = msg[len(m[0]):]
	}
	lines := strings.SplitAfter(string(data), "\n")
	if bad := firstBadLine(lines); bad > 0 {
		line = bad
	}
	if line <= len(lines) {
		text := lines[line-1]
		if indent := text[:len(text)-len(strings.TrimLeft(text, " \t"))]; strings.Contains(indent, "\t") {
			return &Error{File: name, Line: line, Err: errors.New("indented with a tab: YAML indents with spaces only")}
		}
	}
	return &Error{File: name, Line: line, Err: fmt.Errorf("%s (check the indentation, and that every key is followed by a colon and a space)", msg)}
}

// maxScannedLines bounds the file firstBadLine reads again and again: at
// 1000 lines, a quote left open at the top takes 0.1 s.
const maxScannedLines = 2000

// firstBadLine returns the line after the longest run of lines from the
// start that still parses, and from which every longer run fails: the line
// a mistake is on. A shorter run that fails, cut inside a flow mapping
// or a quoted string that later lines close, is passed over. It returns 0
// for a file too long to read that often.
func firstBadLine(lines []string) int {
	if len(lines) > maxScannedLines {
		return 0
	}
	var prefix strings.Builder
	for n := len(lines) - 1; n >= 0; n-- {
		prefix.Reset()
		for _, l := range lines[:n] {
			prefix.WriteString(l)
		}
		if parses(prefix.String()) {
			return n + 1
		}
	}
	return 0
}

// parses reports whether text is YAML without a syntax error.
func parses(text string) bool {
	dec := yaml.NewDecoder(strings.NewReader(text))
	for {
		var n yaml.Node
		switch err := dec.Decode(&n); {
		case errors.Is(err, io.EOF):
			return true
		case err != nil:
			return false
		}
	}
}
