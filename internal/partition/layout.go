// Package partition spreads orders over several state stores by order
// id. A deployment declares its partitions (each a complete sas with its
// own database and queue prefix) and a fixed number of logical buckets,
// each owned by one partition. Applications publish submits to one
// exchange of type x-consistent-hash (RabbitMQ's
// rabbitmq_consistent_hash_exchange plugin) with the order id as routing
// key; the exchange sends each to its bucket's exchange, bound to the
// owning partition's submit entrance. BucketOf computes the same bucket
// from the id, so every sas process knows where an order lives.
package partition

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"sync"

	"sas/internal/messages"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.yaml.in/yaml/v3"
)

// Bounds of a layout.
const (
	DefaultBuckets = 256
	MaxBuckets     = 4096
	MaxPartitions  = 256
)

// Partition is one state store and the queues under its prefix.
type Partition struct {
	// Name names it in metrics, sasctl and the console.
	Name string `yaml:"name" json:"name"`
	// QueuePrefix is its services' SAS_QUEUE_PREFIX.
	QueuePrefix string `yaml:"queue_prefix" json:"queue_prefix"`
	// DatabaseURLEnv names the environment variable holding its database
	// URL, SAS_…_URL (the file holds no secret, and sas redacts such
	// variables' values wherever they could show).
	DatabaseURLEnv string `yaml:"database_url_env" json:"database_url_env"`
	// Added marks a partition added after the buckets were first split
	// (sasctl partitions add): it owns only the buckets moved to it.
	Added bool `yaml:"added,omitempty" json:"added,omitempty"`
}

// SubmitEntrance is the fanout exchange bound to its submit queue, which
// its submitter declares (broker.Topology's entrance).
func (p Partition) SubmitEntrance() string { return p.QueuePrefix + "submit" }

// Layout is a deployment's partitions and buckets.
type Layout struct {
	// Exchange is the x-consistent-hash exchange applications publish
	// submits to, the order id as routing key.
	Exchange string `yaml:"exchange" json:"exchange"`
	// Buckets is the fixed number of logical buckets.
	Buckets    int         `yaml:"buckets" json:"buckets"`
	Partitions []Partition `yaml:"partitions" json:"partitions"`

	// moved are the buckets moved since the file split them (the stores'
	// partition_buckets, Follow), shared by every copy of the layout.
	moved *moved
}

// moved is each moved bucket's owner now, by its index in Partitions.
type moved struct {
	mu     sync.RWMutex
	owners map[int]int
}

var (
	namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)
	// An exchange or prefix: what RabbitMQ names take, without spaces.
	exchangePattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,200}$`)
	// SAS_…_URL: every sas process redacts such variables' values.
	envPattern = regexp.MustCompile(`^SAS_[A-Z0-9_]{0,120}_URL$`)
)

// Load reads a layout file (YAML).
func Load(path string) (Layout, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Layout{}, fmt.Errorf("partitions file: %w", err)
	}
	l, err := Parse(raw)
	if err != nil {
		return Layout{}, fmt.Errorf("partitions file %s: %w", path, err)
	}
	return l, nil
}

// Parse reads a layout and checks it; buckets default to DefaultBuckets.
func Parse(raw []byte) (Layout, error) {
	var l Layout
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&l); err != nil {
		return Layout{}, fmt.Errorf("not a partitions layout: %w", err)
	}
	if l.Buckets == 0 {
		l.Buckets = DefaultBuckets
	}
	l.moved = &moved{}
	return l, l.Check()
}

// Check says what is wrong with a layout.
func (l Layout) Check() error {
	var errs []error
	if !exchangePattern.MatchString(l.Exchange) {
		errs = append(errs, fmt.Errorf("exchange %q: want 1 to 200 letters, digits and _.:-", l.Exchange))
	}
	if l.Buckets < 1 || l.Buckets > MaxBuckets {
		errs = append(errs, fmt.Errorf("buckets %d: want 1 to %d", l.Buckets, MaxBuckets))
	}
	if len(l.Partitions) == 0 || len(l.Partitions) > MaxPartitions {
		errs = append(errs, fmt.Errorf("%d partitions: want 1 to %d", len(l.Partitions), MaxPartitions))
	}
	if len(l.Partitions) > l.Buckets && l.Buckets > 0 {
		errs = append(errs, fmt.Errorf("%d partitions for %d buckets: each needs one at least", len(l.Partitions), l.Buckets))
	}
	if initial := l.initial(); initial == 0 && len(l.Partitions) > 0 {
		errs = append(errs, errors.New("every partition is added: the first must own the buckets the file splits"))
	} else if slices.ContainsFunc(l.Partitions[initial:], func(p Partition) bool { return !p.Added }) {
		errs = append(errs, errors.New("a partition added (added: true) comes before one that is not: added partitions go last"))
	}
	names, prefixes := map[string]bool{}, map[string]bool{}
	for i, p := range l.Partitions {
		switch {
		case !namePattern.MatchString(p.Name):
			errs = append(errs, fmt.Errorf("partition %d: name %q: want 1 to 32 lower-case letters, digits and -", i+1, p.Name))
		case names[p.Name]:
			errs = append(errs, fmt.Errorf("partition %s is named twice", p.Name))
		}
		names[p.Name] = true
		switch {
		case !exchangePattern.MatchString(p.QueuePrefix):
			errs = append(errs, fmt.Errorf("partition %s: queue_prefix %q: want letters, digits and _.:-", p.Name, p.QueuePrefix))
		case prefixes[p.QueuePrefix]:
			errs = append(errs, fmt.Errorf("partition %s: queue_prefix %q is another partition's", p.Name, p.QueuePrefix))
		}
		prefixes[p.QueuePrefix] = true
		if !envPattern.MatchString(p.DatabaseURLEnv) {
			// Not echoed: a URL put there by mistake may hold a password.
			errs = append(errs, fmt.Errorf("partition %s: database_url_env: want the name of the environment variable holding its database URL, SAS_…_URL (whose values sas never shows), not the URL", p.Name))
		}
	}
	return errors.Join(errs...)
}

// initial is how many partitions split the buckets: those not added.
func (l Layout) initial() int {
	n := slices.IndexFunc(l.Partitions, func(p Partition) bool { return p.Added })
	if n < 0 {
		return len(l.Partitions)
	}
	return n
}

// Owner is the index in Partitions of bucket b's partition: its owner
// since it moved (Follow), else as the file splits the buckets, in even
// contiguous runs over the partitions not added later, the first taking
// one more when they do not divide evenly.
func (l Layout) Owner(b int) int {
	if l.moved != nil {
		l.moved.mu.RLock()
		i, ok := l.moved.owners[b]
		l.moved.mu.RUnlock()
		if ok {
			return i
		}
	}
	return l.FirstOwner(b)
}

// FirstOwner is the index in Partitions of bucket b's partition as the
// file splits the buckets, whatever moved since.
func (l Layout) FirstOwner(b int) int {
	return b * l.initial() / l.Buckets
}

// Moved reports whether bucket b has moved since the file split the
// buckets (Follow).
func (l Layout) Moved(b int) bool {
	if l.moved == nil {
		return false
	}
	l.moved.mu.RLock()
	defer l.moved.mu.RUnlock()
	_, ok := l.moved.owners[b]
	return ok
}

// Follow makes the layout (and every copy of it) own the buckets as
// owners (bucket to partition name: the stores' partition_buckets)
// says, in place of its earlier moves. A name not in the layout is an
// error, and leaves the layout as it was.
func (l Layout) Follow(owners map[int]string) error {
	next := make(map[int]int, len(owners))
	for b, name := range owners {
		i := l.Index(name)
		if i < 0 || b < 0 || b >= l.Buckets {
			return fmt.Errorf("bucket %d is partition %q's, which is not in the layout: give every process the same SAS_PARTITIONS_FILE", b, name)
		}
		next[b] = i
	}
	if l.moved == nil {
		return errors.New("a layout made without Parse cannot follow moves")
	}
	l.moved.mu.Lock()
	l.moved.owners = next
	l.moved.mu.Unlock()
	return nil
}

// Index is the index in Partitions of the partition named name, or -1.
func (l Layout) Index(name string) int {
	return slices.IndexFunc(l.Partitions, func(p Partition) bool { return p.Name == name })
}

// BucketOf is an order's bucket.
func (l Layout) BucketOf(orderID string) int { return BucketOf(orderID, l.Buckets) }

// Of is an order's bucket and its partition.
func (l Layout) Of(orderID string) (bucket int, p Partition) {
	b := BucketOf(orderID, l.Buckets)
	return b, l.Partitions[l.Owner(b)]
}

// ScheduleOwner is the index in Partitions of the partition that keeps
// and fires schedule name (its supervisor alone keeps it): the one owning
// the bucket of an id derived from its name.
// The file's split decides it, so that a schedule stays where its
// orders and ticks are when buckets move.
func (l Layout) ScheduleOwner(name string) int {
	return l.FirstOwner(BucketOf(messages.DerivedID("schedule:"+name), l.Buckets))
}

// Owned is the buckets of partition i, first to last.
func (l Layout) Owned(i int) []int {
	var out []int
	for b := range l.Buckets {
		if l.Owner(b) == i {
			out = append(out, b)
		}
	}
	return out
}

// BucketExchange is bucket b's exchange: the routing exchange's name and
// the bucket's number, zero-padded so that names sort as numbers do.
func (l Layout) BucketExchange(b int) string {
	width := len(strconv.Itoa(l.Buckets - 1))
	return fmt.Sprintf("%s.bucket.%0*d", l.Exchange, width, b)
}

// bucketWeight is each bucket exchange's binding key: its weight on the
// ring, one bucket each.
const bucketWeight = "1"

// Declare declares the routing exchange, a fanout exchange per bucket
// bound to it in bucket order, and each bucket's binding to its owner's
// submit entrance (declared too, as the submitter declares it).
//
// The plugin numbers a binding's bucket by the order it was added in,
// and after a broker restart by the bindings sorted (by destination
// name, their weights being equal): binding the zero-padded bucket
// exchanges in number order gives the same numbering both ways.
// Declaring again changes nothing.
func (l Layout) Declare(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(l.Exchange, "x-consistent-hash", true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s (is the rabbitmq_consistent_hash_exchange plugin enabled?): %w", l.Exchange, err)
	}
	for _, p := range l.Partitions {
		if err := ch.ExchangeDeclare(p.SubmitEntrance(), amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", p.SubmitEntrance(), err)
		}
	}
	for b := range l.Buckets {
		name := l.BucketExchange(b)
		if err := ch.ExchangeDeclare(name, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", name, err)
		}
		if err := ch.ExchangeBind(name, bucketWeight, l.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind bucket %d to %s: %w", b, l.Exchange, err)
		}
		if err := l.BindBucket(ch, b); err != nil {
			return err
		}
	}
	return nil
}

// Binder binds and unbinds exchanges (amqp.Channel).
type Binder interface {
	ExchangeBind(destination, key, source string, noWait bool, args amqp.Table) error
	ExchangeUnbind(destination, key, source string, noWait bool, args amqp.Table) error
}

// BindBucket binds bucket b's exchange to its owner's submit entrance,
// then unbinds it from every other partition's: while both are bound a
// submit reaches both (the other passes it on), never neither.
// Unbinding what is not bound changes nothing.
func (l Layout) BindBucket(ch Binder, b int) error {
	name := l.BucketExchange(b)
	owner := l.Owner(b)
	if err := ch.ExchangeBind(l.Partitions[owner].SubmitEntrance(), "", name, false, nil); err != nil {
		return fmt.Errorf("bind bucket %d to partition %s: %w", b, l.Partitions[owner].Name, err)
	}
	for i, p := range l.Partitions {
		if i == owner {
			continue
		}
		if err := ch.ExchangeUnbind(p.SubmitEntrance(), "", name, false, nil); err != nil {
			return fmt.Errorf("unbind bucket %d from partition %s: %w", b, p.Name, err)
		}
	}
	return nil
}

// Renumber rebinds every bucket exchange to the routing exchange in
// number order, so that the plugin's numbering of the buckets is the
// bucket numbers again: RabbitMQ (3.10) numbers them afresh when a node
// restarts, in an order of its own. While it runs, a submit may find
// fewer buckets bound (routed to another bucket, whose partition passes
// it on) or none (returned to its publisher, who publishes it again).
func (l Layout) Renumber(ch *amqp.Channel) error {
	for b := range l.Buckets {
		if err := ch.ExchangeUnbind(l.BucketExchange(b), bucketWeight, l.Exchange, false, nil); err != nil {
			return fmt.Errorf("unbind bucket %d from %s: %w", b, l.Exchange, err)
		}
	}
	for b := range l.Buckets {
		if err := ch.ExchangeBind(l.BucketExchange(b), bucketWeight, l.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind bucket %d to %s: %w", b, l.Exchange, err)
		}
	}
	return nil
}
