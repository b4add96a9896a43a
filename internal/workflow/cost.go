package workflow

import (
	"reflect"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// MaxSchemaSteps bounds the work of checking one payload against its
// workflow's schema: how many times a (sub)schema may be evaluated at a
// value of the payload. A failing evaluation costs the validator about
// 10 µs, so this is about half a second at worst; a 32 KiB payload of a
// thousand items against the built-in order schema takes a few thousand.
// A schema can make the count grow with the payload's nesting (a
// recursive anyOf whose every branch descends: 2^depth); such a payload
// is refused with a reason before the validator runs.
const MaxSchemaSteps = 50_000

// schemaCost bounds, before validation, how many evaluations the
// validator would make: the count of every (schema, value) evaluation the
// validator can reach, each applicator taken (so an anyOf that would stop
// at its first match counts all its branches), memoised per schema and
// value node, so the count itself is polynomial however large its result.
type schemaCost struct {
	root *jsonschema.Schema
	// dynamic holds, by anchor name, every schema a $dynamicRef of that
	// name may land on; recursive, every $recursiveAnchor schema.
	dynamic   map[string][]*jsonschema.Schema
	recursive []*jsonschema.Schema
	// bounded: the schema has no cycle, and perNode times a payload's
	// nodes bounds the count, so most payloads need no counting.
	bounded bool
	perNode int
}

func newSchemaCost(root *jsonschema.Schema) *schemaCost {
	c := &schemaCost{root: root, dynamic: map[string][]*jsonschema.Schema{}}
	seen := map[*jsonschema.Schema]bool{}
	var collect func(s *jsonschema.Schema)
	collect = func(s *jsonschema.Schema) {
		if s == nil || seen[s] {
			return
		}
		seen[s] = true
		if s.DynamicAnchor != "" {
			c.dynamic[s.DynamicAnchor] = append(c.dynamic[s.DynamicAnchor], s)
		}
		if s.RecursiveAnchor {
			c.recursive = append(c.recursive, s)
		}
		for _, t := range c.next(s) {
			collect(t)
		}
	}
	collect(root)
	// Paths from the root; a cycle makes them endless.
	const onStack = -1
	paths := map[*jsonschema.Schema]int{}
	cyclic := false
	var count func(s *jsonschema.Schema) int
	count = func(s *jsonschema.Schema) int {
		if n, ok := paths[s]; ok {
			if n == onStack {
				cyclic = true
			}
			return max(n, 0)
		}
		paths[s] = onStack
		n := 1
		for _, t := range c.next(s) {
			n = min(n+count(t), MaxSchemaSteps+1)
		}
		paths[s] = n
		return n
	}
	c.perNode = count(root)
	c.bounded = !cyclic
	return c
}

// next lists every schema s may hand a value to, in place or to a child
// value: the edges of the schema graph.
func (c *schemaCost) next(s *jsonschema.Schema) []*jsonschema.Schema {
	out := c.inPlace(s, nil)
	add := func(ts ...*jsonschema.Schema) {
		for _, t := range ts {
			if t != nil {
				out = append(out, t)
			}
		}
	}
	for _, t := range s.Properties {
		add(t)
	}
	for _, t := range s.PatternProperties {
		add(t)
	}
	if t, ok := s.AdditionalProperties.(*jsonschema.Schema); ok {
		add(t)
	}
	add(s.PropertyNames, s.UnevaluatedProperties, s.Contains, s.UnevaluatedItems, s.Items2020, s.ContentSchema)
	add(s.PrefixItems...)
	switch items := s.Items.(type) {
	case *jsonschema.Schema:
		add(items)
	case []*jsonschema.Schema:
		add(items...)
	}
	if t, ok := s.AdditionalItems.(*jsonschema.Schema); ok {
		add(t)
	}
	for _, t := range s.DependentSchemas {
		add(t)
	}
	for _, d := range s.Dependencies {
		if t, ok := d.(*jsonschema.Schema); ok {
			add(t)
		}
	}
	return out
}

// inPlace lists the schemas s applies to the same value: references and
// the in-place applicators (dependent schemas are added by the caller,
// which knows the object's keys).
func (c *schemaCost) inPlace(s *jsonschema.Schema, out []*jsonschema.Schema) []*jsonschema.Schema {
	add := func(ts ...*jsonschema.Schema) {
		for _, t := range ts {
			if t != nil {
				out = append(out, t)
			}
		}
	}
	add(s.Ref, s.Not, s.If, s.Then, s.Else)
	add(s.AllOf...)
	add(s.AnyOf...)
	add(s.OneOf...)
	if s.RecursiveRef != nil {
		add(s.RecursiveRef)
		add(c.recursive...)
	}
	if s.DynamicRef != nil {
		add(s.DynamicRef.Ref)
		add(c.dynamic[s.DynamicRef.Anchor]...)
	}
	return out
}

// within reports whether validating v against the schema takes at most
// limit evaluations.
func (c *schemaCost) within(v any, limit int) bool {
	if c.bounded && c.perNode*nodes(v, limit+1) <= limit {
		return true
	}
	k := counter{c: c, limit: limit, memo: map[costKey]int{}, busy: map[costKey]bool{}}
	return k.cost(c.root, v) <= limit
}

// nodes counts v's values, stopping past limit.
func nodes(v any, limit int) int {
	n := 1
	switch v := v.(type) {
	case map[string]any:
		for _, e := range v {
			if n += nodes(e, limit); n > limit {
				return n
			}
		}
	case []any:
		for _, e := range v {
			if n += nodes(e, limit); n > limit {
				return n
			}
		}
	}
	return n
}

type costKey struct {
	s    *jsonschema.Schema
	node uintptr // the object or array evaluated; 0 for any other value
}

type counter struct {
	c     *schemaCost
	limit int
	memo  map[costKey]int
	busy  map[costKey]bool
}

// cost is how many evaluations validating v against s makes at most,
// counted no further than past the limit.
func (k *counter) cost(s *jsonschema.Schema, v any) int {
	key := costKey{s: s}
	switch v.(type) {
	case map[string]any, []any:
		key.node = reflect.ValueOf(v).Pointer()
	}
	if n, ok := k.memo[key]; ok {
		return n
	}
	if k.busy[key] {
		return 1 // the validator stops a reference cycle there
	}
	k.busy[key] = true
	n := 1
	add := func(t *jsonschema.Schema, v any) bool {
		if t != nil && n <= k.limit {
			n += k.cost(t, v)
		}
		return n <= k.limit
	}
	if s.Bool == nil {
		for _, t := range k.c.inPlace(s, nil) {
			if !add(t, v) {
				break
			}
		}
		switch v := v.(type) {
		case map[string]any:
			k.object(s, v, add)
		case []any:
			k.array(s, v, add) // uniqueItems hashes each item once: no more
		}
	}
	delete(k.busy, key)
	k.memo[key] = n
	return n
}

func (k *counter) object(s *jsonschema.Schema, v map[string]any, add func(*jsonschema.Schema, any) bool) {
	for key, e := range v {
		matched := false
		if t, ok := s.Properties[key]; ok {
			matched = true
			if !add(t, e) {
				return
			}
		}
		for re, t := range s.PatternProperties {
			if re.MatchString(key) {
				matched = true
				if !add(t, e) {
					return
				}
			}
		}
		if t, ok := s.AdditionalProperties.(*jsonschema.Schema); ok && !matched && !add(t, e) {
			return
		}
		if !add(s.PropertyNames, key) || !add(s.UnevaluatedProperties, e) || !add(s.DependentSchemas[key], v) {
			return
		}
		if t, ok := s.Dependencies[key].(*jsonschema.Schema); ok && !add(t, v) {
			return
		}
	}
}

func (k *counter) array(s *jsonschema.Schema, v []any, add func(*jsonschema.Schema, any) bool) {
	for i, e := range v {
		if i < len(s.PrefixItems) {
			if !add(s.PrefixItems[i], e) {
				return
			}
		} else if !add(s.Items2020, e) {
			return
		}
		switch items := s.Items.(type) {
		case *jsonschema.Schema:
			if !add(items, e) {
				return
			}
		case []*jsonschema.Schema:
			if i < len(items) {
				if !add(items[i], e) {
					return
				}
			} else if t, ok := s.AdditionalItems.(*jsonschema.Schema); ok && !add(t, e) {
				return
			}
		}
		if !add(s.Contains, e) || !add(s.UnevaluatedItems, e) {
			return
		}
	}
}
