package schema

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The validator evaluates subschemas without memoizing, so its work is a
// product: a value receives every subschema an in-place applicator
// (allOf, anyOf, oneOf, not, if/then/else, $ref, $dynamicRef,
// dependentSchemas) reaches from every subschema it already receives, and
// each of those hands its descending subschemas (properties, items,
// contains, propertyNames, unevaluated*, ...) to the values one level
// down. A 137-byte $defs node whose property is a oneOf of two $refs to
// itself doubles the work per level: 7 s and 1.7 GB for 142 bytes nested
// 20 deep.
//
// The bound below follows that product statically. For each subschema s
// and nesting level d it computes work(s, d), an upper bound on what one
// evaluation of s costs a single value d levels below, by
//
//	work(s, 0) = self(s) + Σ work(c, 0)           c applied in place
//	work(s, d) = Σ work(c, d) + child(s, d-1)     d > 0
//
// where child takes, per kind of child (member value, item, member name),
// the most expensive keyword that can apply to one child (properties and
// additionalProperties exclude each other; prefixItems and items too) plus
// the keywords that apply to it as well (patternProperties, contains,
// unevaluated*). In-place applicators add up even where at most one
// could succeed: the validator tries them all, and that is the cost. A
// $dynamicRef takes the most expensive schema that declares its anchor.
// An in-place cycle (a schema reaching itself without descending) is
// refused: it never terminates with a result worth having.
//
// The work is not one number, because what a check costs depends on the
// value: a pattern costs per byte of the string, uniqueItems per node
// below the array, an exact comparison per digit of the number. So work is
// a vector of such rates, and Check multiplies it with the payload's
// measure at each level. Rates are nanoseconds on one core of the
// development machine, rounded up from measurements of the library
// (v6.0.3); the budget leaves headroom for slower cores.
const (
	// Budget is the most modelled work one Check may start, in
	// nanoseconds: above it the payload is refused before validating.
	Budget = 50_000_000

	costEval        = 1500  // one evaluation of one subschema, failure report included
	costLevel       = 20    // more per level of nesting: every failure copies its location
	costMember      = 60    // per member or item of the value, per evaluation (the loops)
	costUneval      = 400   // that, where unevaluated* keep sets of members and items
	costCompare     = 20    // per node of a const or enum value compared
	costMatch       = 200   // one regular expression call (per byte: see pattern)
	costFormat      = 100   // per byte, a format check
	costRegexFormat = 30000 // per byte, "format": "regex" parsing the string
	costRunes       = 2     // per byte, counting characters
	costHash        = 200   // per node below an array, hashing for uniqueItems
	costPairs       = 20    // uniqueItems compares up to 20 items pairwise
)

// numCost is one exact parse of a number literal (fmt, then
// big.Rat.SetString): 0.8 µs for 1, 3.7 µs for 1e400, 5.6 µs for 400
// digits.
func numCost(lit string) uint64 {
	exp, frac := exponent(lit)
	return 1000 + 15*uint64(len(lit)) + 7*uint64(min(exp, 1<<20)+frac)
}

// maxNumCost is the dearest literal checkNumber lets through.
var maxNumCost = numCost("0." + strings.Repeat("9", MaxDigits-1))

// Rates of a work vector.
const (
	wEvals    = iota // evaluations, each also charged per member and per level
	wFixed           // ns whatever the value
	wNumParse        // exact parses of the value, when a number
	wNumFixed        // ns more when the value is a number
	wStrByte         // ns per byte of the value, when a string or a member name
	wMembers         // ns per member of the value, when an object
	wKeyByte         // ns per byte of its member names
	wUniq            // uniqueItems checks of the value, when an array
	wN
)

type work [wN]uint64

func (w *work) add(o *work) {
	for i := range w {
		w[i] = add(w[i], o[i])
	}
}

func (w *work) max(o *work) {
	for i := range w {
		w[i] = max(w[i], o[i])
	}
}

// add and mul saturate: a bound past 2^64 is refused like any other.
func add(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}

func mul(a, b uint64) uint64 {
	if a != 0 && b > math.MaxUint64/a {
		return math.MaxUint64
	}
	return a * b
}

// node is one compiled subschema, or the group of schemas a $dynamicRef
// may resolve to.
type node struct {
	self  work
	group bool  // in holds the alternatives: the most expensive counts
	in    []int // applied in place
	// Children: one of each max list applies to a child, all of each sum.
	objMax, objSum, arrMax, arrSum, names []int
}

type schemaGraph struct {
	nodes  []node
	index  map[*jsonschema.Schema]int
	groups map[string]int
	queue  []*jsonschema.Schema
	order  []int // in-place targets before their sources
	keys   bool  // some propertyNames: member names are values too
	uneval bool  // some unevaluated*: evaluations copy member sets
}

// graph builds the subschema graph from the compiled root (index 0).
func graph(c *jsonschema.Compiler, root *jsonschema.Schema, doc any) (*schemaGraph, error) {
	g := &schemaGraph{index: map[*jsonschema.Schema]int{}, groups: map[string]int{}}
	g.id(root)
	if err := g.drain(); err != nil {
		return nil, err
	}
	if len(g.groups) > 0 {
		// Any schema declaring a $dynamicAnchor may be chosen, also one
		// nothing refers to: compile each (the compiler returns the one
		// it holds) so the group is complete.
		var err error
		walkAnchors(doc, nil, func(ptr string) {
			sch, cerr := c.Compile(base + "#" + ptr)
			if cerr != nil && err == nil {
				err = fmt.Errorf("the $dynamicAnchor at %s cannot be resolved", ptr)
			}
			if cerr == nil {
				g.id(sch)
			}
		})
		if err != nil {
			return nil, err
		}
		if err := g.drain(); err != nil {
			return nil, err
		}
		for sch, i := range g.index {
			if gi, ok := g.groups[sch.DynamicAnchor]; ok && sch.DynamicAnchor != "" {
				g.nodes[gi].in = append(g.nodes[gi].in, i)
			}
		}
	}
	return g, g.sort()
}

func walkAnchors(v any, path []string, f func(ptr string)) {
	switch v := v.(type) {
	case map[string]any:
		if _, ok := v["$dynamicAnchor"].(string); ok {
			var b strings.Builder
			for _, p := range path {
				b.WriteString("/" + url.PathEscape(strings.ReplaceAll(strings.ReplaceAll(p, "~", "~0"), "/", "~1")))
			}
			f(b.String())
		}
		for k, x := range v {
			walkAnchors(x, append(path, k), f)
		}
	case []any:
		for i, x := range v {
			walkAnchors(x, append(path, strconv.Itoa(i)), f)
		}
	}
}

func (g *schemaGraph) id(s *jsonschema.Schema) int {
	if i, ok := g.index[s]; ok {
		return i
	}
	g.index[s] = len(g.nodes)
	g.nodes = append(g.nodes, node{})
	g.queue = append(g.queue, s)
	return len(g.nodes) - 1
}

func (g *schemaGraph) group(anchor string) int {
	if i, ok := g.groups[anchor]; ok {
		return i
	}
	g.groups[anchor] = len(g.nodes)
	g.nodes = append(g.nodes, node{group: true})
	return len(g.nodes) - 1
}

// drain adds the edges and own work of every queued schema.
func (g *schemaGraph) drain() error {
	for len(g.queue) > 0 {
		s := g.queue[0]
		g.queue = g.queue[1:]
		i := g.index[s]
		n, err := g.edges(s)
		if err != nil {
			return err
		}
		n.self = self(s)
		g.nodes[i] = n
	}
	return nil
}

func (g *schemaGraph) edges(s *jsonschema.Schema) (node, error) {
	var n node
	ids := func(list *[]int, subs ...*jsonschema.Schema) {
		for _, sub := range subs {
			if sub != nil {
				*list = append(*list, g.id(sub))
			}
		}
	}
	if s.Bool != nil {
		return n, nil
	}
	if s.RecursiveRef != nil {
		return n, fmt.Errorf("$recursiveRef (draft 2019-09) is not supported; use $dynamicRef (draft 2020-12)")
	}
	if s.ContentSchema != nil || len(s.Extensions) > 0 {
		return n, fmt.Errorf("contentSchema and vocabularies are not supported")
	}
	ids(&n.in, s.Ref, s.Not, s.If, s.Then, s.Else)
	ids(&n.in, s.AllOf...)
	ids(&n.in, s.AnyOf...)
	ids(&n.in, s.OneOf...)
	for _, sub := range s.DependentSchemas {
		ids(&n.in, sub)
	}
	for _, dep := range s.Dependencies {
		if sub, ok := dep.(*jsonschema.Schema); ok {
			ids(&n.in, sub)
		}
	}
	if d := s.DynamicRef; d != nil {
		if d.Anchor != "" && d.Ref.DynamicAnchor == d.Anchor {
			n.in = append(n.in, g.group(d.Anchor))
		} else {
			ids(&n.in, d.Ref)
		}
	}
	for _, sub := range s.Properties {
		ids(&n.objMax, sub)
	}
	if sub, ok := s.AdditionalProperties.(*jsonschema.Schema); ok {
		ids(&n.objMax, sub)
	}
	for _, sub := range s.PatternProperties {
		ids(&n.objSum, sub)
	}
	ids(&n.objSum, s.UnevaluatedProperties)
	ids(&n.arrMax, s.PrefixItems...)
	ids(&n.arrMax, s.Items2020)
	switch items := s.Items.(type) {
	case *jsonschema.Schema:
		ids(&n.arrMax, items)
	case []*jsonschema.Schema:
		ids(&n.arrMax, items...)
	}
	if sub, ok := s.AdditionalItems.(*jsonschema.Schema); ok {
		ids(&n.arrMax, sub)
	}
	ids(&n.arrSum, s.Contains, s.UnevaluatedItems)
	if s.UnevaluatedItems != nil || s.UnevaluatedProperties != nil {
		g.uneval = true
	}
	if s.PropertyNames != nil {
		g.keys = true
		ids(&n.names, s.PropertyNames)
	}
	return n, nil
}

// self is what one evaluation of s costs by itself, per rate.
func self(s *jsonschema.Schema) work {
	var w work
	w[wEvals] = 1
	if s.Bool != nil {
		return w
	}
	if s.Types != nil && slices.Contains(s.Types.ToStrings(), "integer") {
		w[wNumParse]++ // an integer check parses the number
	}
	if s.Const != nil {
		compare(*s.Const, &w)
	}
	if s.Enum != nil {
		for _, v := range s.Enum.Values {
			compare(v, &w)
		}
	}
	if s.Format != nil {
		if s.Format.Name == "regex" {
			w[wStrByte] += costRegexFormat
		} else {
			w[wStrByte] += costFormat
		}
	}
	names := len(s.Required) + len(s.DependentRequired) + len(s.DependentSchemas) + len(s.Dependencies)
	for _, r := range s.DependentRequired {
		names += len(r)
	}
	for _, d := range s.Dependencies {
		if r, ok := d.([]string); ok {
			names += len(r)
		}
	}
	w[wFixed] += uint64(names) * costCompare
	bounds := 0
	for _, r := range []*big.Rat{s.Minimum, s.Maximum, s.ExclusiveMinimum, s.ExclusiveMaximum, s.MultipleOf} {
		if r != nil {
			bounds++
			w[wNumFixed] += 1000 + 2*uint64(r.Num().BitLen()+r.Denom().BitLen())
		}
	}
	if bounds > 0 {
		w[wNumParse]++ // parsed once per evaluation
	}
	if s.MultipleOf != nil {
		w[wNumParse]++ // and divided
	}
	if s.MinLength != nil || s.MaxLength != nil {
		w[wStrByte] += costRunes
	}
	if s.Pattern != nil {
		w[wFixed] += costMatch
		w[wStrByte] += perByte(s.Pattern)
	}
	for re := range s.PatternProperties {
		w[wMembers] += costMatch
		w[wKeyByte] += perByte(re)
	}
	if s.UniqueItems {
		w[wUniq]++
	}
	return w
}

func perByte(re jsonschema.Regexp) uint64 {
	if p, ok := re.(*pattern); ok {
		return p.perByte
	}
	return 60 * MaxPatternInsts
}

// compare adds one comparison with a const or enum value. A number is
// parsed on both sides at every comparison; anything else costs per node
// of the value (the instance side can be no larger where they are equal).
func compare(v any, w *work) {
	switch v := v.(type) {
	case json.Number:
		w[wNumParse]++
		w[wNumFixed] += numCost(string(v))
	default:
		w[wFixed] = add(w[wFixed], deep(v))
	}
}

func deep(v any) uint64 {
	switch v := v.(type) {
	case map[string]any:
		n := uint64(costCompare)
		for k, x := range v {
			n = add(n, add(uint64(len(k))/8, deep(x)))
		}
		return n
	case []any:
		n := uint64(costCompare)
		for _, x := range v {
			n = add(n, deep(x))
		}
		return n
	case json.Number:
		return numCost(string(v)) + maxNumCost
	case string:
		return costCompare + uint64(len(v))/8
	default:
		return costCompare
	}
}

// sort orders the nodes so that in-place targets come first, refusing an
// in-place cycle.
func (g *schemaGraph) sort() error {
	const (
		unseen = iota
		open
		closed
	)
	state := make([]byte, len(g.nodes))
	var visit func(i int) error
	visit = func(i int) error {
		switch state[i] {
		case open:
			return fmt.Errorf("a subschema applies itself to the same value through $ref/allOf/anyOf/oneOf/not/if/then/else without descending into it (an endless loop)")
		case closed:
			return nil
		}
		state[i] = open
		for _, c := range g.nodes[i].in {
			if err := visit(c); err != nil {
				return err
			}
		}
		state[i] = closed
		g.order = append(g.order, i)
		return nil
	}
	for i := range g.nodes {
		if err := visit(i); err != nil {
			return err
		}
	}
	return nil
}

// bounds returns work(root, d) for d = 0..depth, one level at a time.
func (g *schemaGraph) bounds(depth int) []work {
	out := make([]work, depth+1)
	prev := make([]work, len(g.nodes))
	cur := make([]work, len(g.nodes))
	for d := 0; d <= depth; d++ {
		for _, i := range g.order {
			n := &g.nodes[i]
			var w work
			if d == 0 {
				w = n.self
			}
			for _, c := range n.in {
				if n.group {
					w.max(&cur[c])
				} else {
					w.add(&cur[c])
				}
			}
			if d > 0 && !n.group {
				ch := child(n, prev)
				w.add(&ch)
			}
			cur[i] = w
		}
		out[d] = cur[0]
		prev, cur = cur, prev
	}
	return out
}

func child(n *node, prev []work) work {
	one := func(most, all []int) work {
		var w work
		for _, c := range most {
			w.max(&prev[c])
		}
		for _, c := range all {
			w.add(&prev[c])
		}
		return w
	}
	w := one(n.objMax, n.objSum)
	arr := one(n.arrMax, n.arrSum)
	names := one(nil, n.names)
	w.max(&arr)
	w.max(&names)
	return w
}

// thin refuses a schema whose work multiplies with nesting: checking a
// payload that is a single chain of values MaxDepth levels deep must fit
// a quarter of the budget.
func (s *Schema) thin() error {
	var total, evals uint64
	for d, b := range s.bound {
		evals = add(evals, b[wEvals])
		total = add(total, add(mul(b[wEvals], costEval+costLevel*uint64(d)+costMember), b[wFixed]))
		if total <= Budget/4 {
			continue
		}
		count := "more than 10^18"
		if evals < 1e18 {
			count = strconv.FormatUint(evals, 10)
		}
		if d == 0 {
			return fmt.Errorf("checking one value would evaluate %s subschemas or compare too many enum values; allOf/anyOf/oneOf/$ref that reach the same subschema many times multiply; simplify the schema", count)
		}
		return fmt.Errorf("checking a value nested %d levels deep would evaluate %s subschemas: schema evaluation grows too fast with nesting (oneOf/anyOf/allOf reaching the same $ref more than once multiply at every level); simplify the schema", d, count)
	}
	return nil
}

// level measures the values at one depth of a payload.
type level struct {
	nodes, edges, nums, numCost, strBytes, members, keyBytes, uniq uint64
}

// measure walks a payload once, refusing nesting beyond MaxDepth and
// number literals beyond checkNumber, and measures each level.
func measure(inst any, keys bool) ([]level, *Problem) {
	levels := make([]level, MaxDepth+1)
	var walk func(v any, d int) (nodes, nums uint64, p *Problem)
	walk = func(v any, d int) (nodes, nums uint64, p *Problem) {
		l := &levels[d]
		l.nodes++
		nodes = 1
		switch v := v.(type) {
		case map[string]any:
			if d >= MaxDepth {
				return 0, 0, &Problem{Message: fmt.Sprintf("nested deeper than %d levels", MaxDepth)}
			}
			l.edges += uint64(len(v))
			l.members += uint64(len(v))
			for k, x := range v {
				l.keyBytes += uint64(len(k))
				if keys {
					levels[d+1].nodes++
					levels[d+1].strBytes += uint64(len(k))
				}
				n, c, p := walk(x, d+1)
				if p != nil {
					p.Pointer = Pointer([]string{k}) + p.Pointer
					return 0, 0, p
				}
				nodes, nums = nodes+n+1, nums+c
			}
		case []any:
			if d >= MaxDepth {
				return 0, 0, &Problem{Message: fmt.Sprintf("nested deeper than %d levels", MaxDepth)}
			}
			l.edges += uint64(len(v))
			for i, x := range v {
				n, c, p := walk(x, d+1)
				if p != nil {
					p.Pointer = "/" + strconv.Itoa(i) + p.Pointer
					return 0, 0, p
				}
				nodes, nums = nodes+n, nums+c
			}
			pairs := uint64(1)
			if len(v) <= 20 {
				pairs = costPairs
			}
			l.uniq = add(l.uniq, mul(pairs, add(mul(costHash, nodes), nums)))
		case string:
			l.strBytes += uint64(len(v))
		case json.Number:
			if err := checkNumber(string(v)); err != nil {
				return 0, 0, &Problem{Message: err.Error()}
			}
			c := numCost(string(v))
			l.nums++
			l.numCost += c
			nums = c
		case float64:
			c := numCost(strconv.FormatFloat(v, 'g', -1, 64))
			l.nums++
			l.numCost += c
			nums = c
		}
		return nodes, nums, nil
	}
	if _, _, p := walk(inst, 0); p != nil {
		return nil, p
	}
	return levels, nil
}

// cost is the bound on validating a payload of this measure.
func (s *Schema) cost(levels []level) uint64 {
	var total uint64
	member := uint64(costMember)
	if s.uneval {
		member = costUneval
	}
	for d, l := range levels {
		if l.nodes == 0 {
			break
		}
		b := &s.bound[d]
		terms := [...]uint64{
			mul(b[wEvals], add(mul(l.nodes, costEval+costLevel*uint64(d)), mul(l.edges, member))),
			mul(b[wFixed], l.nodes),
			mul(b[wNumParse], l.numCost),
			mul(b[wNumFixed], l.nums),
			mul(b[wStrByte], l.strBytes),
			mul(b[wMembers], l.members),
			mul(b[wKeyByte], l.keyBytes),
			mul(b[wUniq], l.uniq),
		}
		for _, t := range terms {
			total = add(total, t)
		}
	}
	return total
}
