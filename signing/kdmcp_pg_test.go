package signing_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/dojo-relay/dojo/kungfu/kungfutest"
	"github.com/dojo-relay/dojo/signing"
)

var (
	kdSeed  = flag.Uint64("kd.seed", 8, "seed of TestCanonicalPostgres's generator")
	kdCases = flag.Int("kd.cases", 10000, "how many cases TestCanonicalPostgres generates")
)

// TestCanonicalPostgres is the differential test of Canonical against
// PostgreSQL's own jsonb::text: first the named cases of canonCases, then
// generated documents (seeded, so a failure reproduces with -kd.seed). A
// document PostgreSQL refuses must be refused too. Run another seed with
// go test ./signing -run TestCanonicalPostgres -kd.seed=N -kd.cases=100000.
func TestCanonicalPostgres(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, kungfutest.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var encoding string
	if err := conn.QueryRow(ctx, "show server_encoding").Scan(&encoding); err != nil || encoding != "UTF8" {
		t.Fatalf("server encoding %q, %v: the comparison needs UTF8", encoding, err)
	}
	// A refusal becomes NULL, so one bad document does not fail its batch.
	if _, err := conn.Exec(ctx, `create function pg_temp.kd_canon(t text) returns text
		language plpgsql as $$
		begin return t::jsonb::text; exception when others then return null; end $$`); err != nil {
		t.Fatal(err)
	}

	var table []string
	for _, c := range canonCases {
		table = append(table, c.in)
	}
	got := pgCanon(ctx, t, conn, table)
	for i, c := range canonCases {
		switch {
		case c.refused && got[i] != nil:
			t.Errorf("table %s: PostgreSQL prints %.80q, the table says refused", c.name, *got[i])
		case !c.refused && got[i] == nil:
			t.Errorf("table %s: PostgreSQL refuses %q", c.name, c.in)
		case !c.refused && *got[i] != c.want:
			t.Errorf("table %s: PostgreSQL prints %.80q, the table says %.80q", c.name, *got[i], c.want)
		}
	}

	g := &docGen{r: rand.New(rand.NewPCG(*kdSeed, 0x6b642d6d63702d31))}
	docs := make([]doc, *kdCases)
	for i := range docs {
		docs[i] = g.doc()
	}
	accepted, refused, failures := map[string]int{}, map[string]int{}, 0
	const batch = 500
	for lo := 0; lo < len(docs); lo += batch {
		hi := min(lo+batch, len(docs))
		texts := make([]string, 0, hi-lo)
		for _, d := range docs[lo:hi] {
			texts = append(texts, d.text)
		}
		pg := pgCanon(ctx, t, conn, texts)
		for i, d := range docs[lo:hi] {
			ours, err := signing.Canonical([]byte(d.text))
			ok := false
			switch {
			case pg[i] == nil && err == nil:
				t.Errorf("seed %d case %d (%s): PostgreSQL refuses %.200q, we print %.200q", *kdSeed, lo+i, d.kind, d.text, ours)
			case pg[i] != nil && err != nil:
				t.Errorf("seed %d case %d (%s): %.200q: PostgreSQL prints %.200q, we refuse: %v", *kdSeed, lo+i, d.kind, d.text, *pg[i], err)
			case pg[i] != nil && string(ours) != *pg[i]:
				at := diffAt(*pg[i], string(ours))
				t.Errorf("seed %d case %d (%s): %.200q: from byte %d:\nPostgreSQL %.80q\n       ours %.80q", *kdSeed, lo+i, d.kind, d.text, at, (*pg[i])[at:], ours[at:])
			default:
				ok = true
			}
			if !ok {
				if failures++; failures >= 20 {
					t.Fatal("too many disagreements")
				}
			}
			if pg[i] == nil {
				refused[d.kind]++
			} else {
				accepted[d.kind]++
			}
		}
	}
	// Guard the generator: every kind must produce documents PostgreSQL
	// accepts, and the refusals must be a real share but not most.
	total := 0
	for _, k := range docKinds {
		if accepted[k] == 0 {
			t.Errorf("kind %s: no accepted document in %d cases", k, *kdCases)
		}
		total += refused[k]
	}
	if total < len(docs)/50 || total > len(docs)/3 {
		t.Errorf("%d of %d documents refused: the generator is off balance", total, len(docs))
	}
	t.Logf("seed %d: accepted %v, refused %v", *kdSeed, accepted, refused)
}

// pgCanon returns PostgreSQL's jsonb::text of each text, nil where it refuses.
func pgCanon(ctx context.Context, t *testing.T, conn *pgx.Conn, texts []string) []*string {
	t.Helper()
	rows, err := conn.Query(ctx, `select pg_temp.kd_canon(t) from unnest($1::text[]) with ordinality as u(t, n) order by n`, texts)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[*string])
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(texts) {
		t.Fatalf("%d rows for %d texts", len(out), len(texts))
	}
	return out
}

// diffAt is the offset of the first byte where a and b differ.
func diffAt(a, b string) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

type doc struct{ kind, text string }

var docKinds = []string{"mixed", "keys", "strings", "numbers", "extreme numbers", "deep", "mutated"}

// docGen writes random JSON documents biased toward what the printer can
// get wrong: escapes and raw Unicode, keys of equal length and keys equal
// once unescaped, every spelling of a number, the edges of PostgreSQL's
// numeric range, deep nesting, and near-miss syntax.
type docGen struct {
	r *rand.Rand
	b strings.Builder
}

func (g *docGen) doc() doc {
	g.b.Reset()
	kind := docKinds[g.r.IntN(len(docKinds))]
	g.ws()
	switch kind {
	case "mixed":
		g.value(1 + g.r.IntN(4))
	case "keys":
		g.object(2, 2+g.r.IntN(10))
	case "strings":
		g.array(func() { g.str(false) }, 1+g.r.IntN(6))
	case "numbers":
		g.array(g.number, 1+g.r.IntN(8))
	case "extreme numbers":
		// Few per document: each may print 131 072 digits.
		g.array(func() {
			if g.r.IntN(2) == 0 {
				g.extreme()
			} else {
				g.number()
			}
		}, 1+g.r.IntN(3))
	case "deep":
		g.deep()
	case "mutated":
		return doc{kind, g.mutate()}
	}
	g.ws()
	return doc{kind, g.b.String()}
}

func (g *docGen) pick(s ...string) string { return s[g.r.IntN(len(s))] }

func (g *docGen) ws() {
	if g.r.IntN(4) == 0 {
		for n := 1 + g.r.IntN(3); n > 0; n-- {
			g.b.WriteString(g.pick(" ", "\t", "\n", "\r"))
		}
	}
}

func (g *docGen) value(depth int) {
	switch n := g.r.IntN(10); {
	case n < 2 && depth > 0:
		g.object(depth-1, g.r.IntN(5))
	case n < 4 && depth > 0:
		g.array(func() { g.value(depth - 1) }, g.r.IntN(5))
	case n < 6:
		g.str(false)
	case n < 9:
		g.number()
	default:
		g.b.WriteString(g.pick("true", "false", "null"))
	}
}

func (g *docGen) array(elem func(), n int) {
	g.b.WriteByte('[')
	g.ws()
	for i := range n {
		if i > 0 {
			g.b.WriteByte(',')
			g.ws()
		}
		elem()
		g.ws()
	}
	g.b.WriteByte(']')
}

func (g *docGen) object(depth, n int) {
	g.b.WriteByte('{')
	g.ws()
	for i := range n {
		if i > 0 {
			g.b.WriteByte(',')
			g.ws()
		}
		g.str(true)
		g.ws()
		g.b.WriteByte(':')
		g.ws()
		g.value(depth)
		g.ws()
	}
	g.b.WriteByte('}')
}

// keyPool has keys that collide once unescaped ("a", "\u0061"), keys of
// one length that sort bytewise, and keys whose byte and rune lengths differ.
var keyPool = []string{
	`a`, `\u0061`, `\u0041`, `b`, `A`, `_`, `~`, ``, `ab`, `ba`, `aa`, `a\u0062`, `\u0061b`,
	`é`, `\u00e9`, `\u00E9`, `e\u0301`, `zz`, `中`, `😀`, `\ud83d\ude00`, `\/`, `/`, `\"`, `\\`,
	`\n`, `\u000a`, `key`, `kez`, `kex`, `reason`, `agent_id`, `finding_id`, `x<`, `x&`, `<\u0026`,
}

func (g *docGen) str(key bool) {
	if key && g.r.IntN(10) < 7 {
		g.b.WriteString(`"` + g.pick(keyPool...) + `"`)
		return
	}
	g.b.WriteByte('"')
	for n := g.r.IntN(9); n > 0; n-- {
		g.piece()
	}
	g.b.WriteByte('"')
}

func (g *docGen) hex4(r rune) string {
	s := fmt.Sprintf("%04x", r)
	if g.r.IntN(2) == 0 {
		s = strings.ToUpper(s)
	}
	return `\u` + s
}

// piece writes one bit of string content; about one in 150 is something
// PostgreSQL refuses.
func (g *docGen) piece() {
	switch g.r.IntN(15) {
	case 0:
		for n := 1 + g.r.IntN(6); n > 0; n-- {
			g.b.WriteByte(byte('a' + g.r.IntN(26)))
		}
	case 1:
		g.b.WriteString(g.pick("<", ">", "&", "'", "/", " ", "\u007f", "`", "%", "=", "?"))
	case 2:
		g.b.WriteString(g.pick(`\/`, `\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`))
	case 3: // control characters and escaped ASCII
		g.b.WriteString(g.hex4(rune(1 + g.r.IntN(0x7f))))
	case 4:
		g.b.WriteString(g.pick("é", "中", "😀", "𝄞", "\u2028", "\u2029", "\u0301", "\ufeff", "\uffff", "\U0010ffff", "\u00a0", "ß", "\u200d"))
	case 5: // any BMP character but NUL and surrogates
		r := rune(1 + g.r.IntN(0xfffe))
		if r >= 0xd800 && r <= 0xdfff {
			r -= 0x800
		}
		g.b.WriteString(g.hex4(r))
	case 6: // an escaped astral character
		r := rune(0x10000 + g.r.IntN(0x100000))
		g.b.WriteString(g.hex4(0xd800+(r-0x10000)>>10) + g.hex4(0xdc00+(r-0x10000)&0x3ff))
	case 7: // a raw character from anywhere
		r := rune(0x20 + g.r.IntN(0x10ffff-0x20))
		if r == '"' || r == '\\' || !utf8.ValidRune(r) {
			r = 'x'
		}
		g.b.WriteRune(r)
	case 8:
		g.b.WriteString(g.pick(`\u2028`, `\u2029`, `\u003C`, `\u0026`, `\u0027`, `\u005c`, `\u0022`, `\u002F`, `\u007F`))
	case 9:
		if g.r.IntN(10) == 0 {
			g.b.WriteString(g.pick(`\u0000`, `\ud800`, `\udfff`, `\ud83d\ud83d`, `\ud83dx`, `\ud83d\n`, "\x01", "\x1f", "\t", `\x41`, `\u12`, `\U0041`, `\'`))
		} else {
			g.b.WriteString("é")
		}
	default:
		g.b.WriteString(g.pick("x", "Y", "0", "-", "_", " "))
	}
}

func (g *docGen) digits(n int, nonzeroFirst bool) string {
	var s strings.Builder
	for i := range n {
		c := byte('0' + g.r.IntN(10))
		if i == 0 && nonzeroFirst {
			c = byte('1' + g.r.IntN(9))
		}
		s.WriteByte(c)
	}
	return s.String()
}

// number writes an ordinary number literal in any of its spellings.
func (g *docGen) number() {
	if g.r.IntN(3) == 0 {
		g.b.WriteByte('-')
	}
	switch n := g.r.IntN(10); {
	case n < 3:
		g.b.WriteByte('0')
	case n < 9:
		g.b.WriteString(g.digits(1+g.r.IntN(8), true))
	default:
		g.b.WriteString(g.digits(1+g.r.IntN(60), true))
	}
	if g.r.IntN(2) == 0 {
		g.b.WriteString("." + strings.Repeat("0", g.r.IntN(3)) + g.digits(g.r.IntN(12), false) + strings.Repeat("0", g.r.IntN(4)))
		if strings.HasSuffix(g.b.String(), ".") {
			g.b.WriteByte('0')
		}
	}
	if g.r.IntN(5) < 2 {
		g.b.WriteString(g.pick("e", "E") + g.pick("", "+", "-") + strings.Repeat("0", g.r.IntN(3)))
		if g.r.IntN(5) == 0 {
			g.b.WriteString(strconv.Itoa(g.r.IntN(400)))
		} else {
			g.b.WriteString(strconv.Itoa(g.r.IntN(25)))
		}
	}
}

// extreme writes a number at an edge of PostgreSQL's numeric range, on
// either side: the power of ten of the leading digit around 131 071, the
// scale around 16 383, the exponent around 2^30.
func (g *docGen) extreme() {
	if g.r.IntN(2) == 0 {
		g.b.WriteByte('-')
	}
	zeros := strings.Repeat("0", g.r.IntN(3))
	intPart := g.pick("0", g.digits(1+g.r.IntN(5), true))
	frac := ""
	if g.r.IntN(2) == 0 {
		frac = zeros + g.digits(g.r.IntN(6), false)
	}
	lit := intPart
	if frac != "" {
		lit += "." + frac
	}
	lead := strings.IndexFunc(intPart+frac, func(r rune) bool { return r != '0' })
	var exp int
	switch g.r.IntN(3) {
	case 0: // leading digit at 10^(131071 + δ)
		if lead < 0 {
			lead = 0
		}
		exp = 131071 + g.r.IntN(5) - 2 + lead + 1 - len(intPart)
	case 1: // scale len(frac) - exp at 16383 + δ
		exp = len(frac) - (16383 + g.r.IntN(5) - 2)
	default:
		exp = g.r.IntN(5) - 2 + (1<<30 - 1)
		if g.r.IntN(2) == 0 {
			exp = -exp
		}
	}
	g.b.WriteString(lit + g.pick("e", "E"))
	if exp >= 0 {
		g.b.WriteString(g.pick("", "+"))
	}
	g.b.WriteString(strconv.Itoa(exp))
}

// deep nests arrays and objects up to the 64 levels Canonical allows, with
// siblings on the way down.
func (g *docGen) deep() {
	depth := 1 + g.r.IntN(64)
	if g.r.IntN(3) == 0 {
		depth = 64
	}
	closers := make([]byte, 0, depth)
	for range depth {
		if g.r.IntN(2) == 0 {
			g.b.WriteByte('[')
			if g.r.IntN(4) == 0 {
				g.value(0)
				g.b.WriteByte(',')
			}
			closers = append(closers, ']')
		} else {
			g.b.WriteByte('{')
			if g.r.IntN(4) == 0 {
				g.str(true)
				g.b.WriteByte(':')
				g.value(0)
				g.b.WriteByte(',')
			}
			g.str(true)
			g.b.WriteByte(':')
			closers = append(closers, '}')
		}
		g.ws()
	}
	g.value(0)
	for i := len(closers) - 1; i >= 0; i-- {
		g.b.WriteByte(closers[i])
	}
}

// mutate damages a small document by one byte: PostgreSQL and Canonical
// must then agree on whether it is still JSON.
func (g *docGen) mutate() string {
	g.value(1 + g.r.IntN(2))
	s := []byte(g.b.String())
	for {
		t := append([]byte(nil), s...)
		i := g.r.IntN(len(t) + 1)
		switch g.r.IntN(3) {
		case 0: // delete
			if i < len(t) {
				t = append(t[:i], t[i+1:]...)
			}
		case 1: // insert
			c := g.pick(",", ":", "[", "]", "{", "}", `"`, `\`, "0", "1", "-", "+", ".", "e", "E", " ", "\f", "u", "x")
			t = append(t[:i], append([]byte(c), t[i:]...)...)
		default: // replace
			if i < len(t) {
				t[i] = g.pick(",", ":", "]", "}", `"`, "0", "e", ".", "-", " ")[0]
			}
		}
		if utf8.Valid(t) { // PostgreSQL refuses invalid UTF-8 for the whole batch
			return string(t)
		}
	}
}
