package partition

// This file computes, for a routing key, the bucket RabbitMQ's
// consistent-hash exchange (rabbitmq_consistent_hash_exchange, 3.8 and
// later) routes it to: the Erlang term hash erlang:phash2/1 of the key
// (a binary), then a jump consistent hash over the exchange's buckets
// drawn from Erlang's exs1024 generator seeded with it. Every sas
// process then knows an order's bucket from its id, as the broker does,
// without asking it. TestBucketIsTheBrokers checks it against the
// broker and against the Erlang runtime.

// goldenRatio is the constant of Bob Jenkins' lookup2 hash, which
// erlang:phash2 uses for binaries.
const goldenRatio = 0x9e3779b9

// binaryHashSeed is phash2's starting value for a binary: the golden
// ratio times 13, modulo 2^32.
const binaryHashSeed = 0x08d12e65

// phash2Range is phash2/1's range: 2^27.
const phash2Range = 1 << 27

func mix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= b
	a -= c
	a ^= c >> 13
	b -= c
	b -= a
	b ^= a << 8
	c -= a
	c -= b
	c ^= b >> 13
	a -= b
	a -= c
	a ^= c >> 12
	b -= c
	b -= a
	b ^= a << 16
	c -= a
	c -= b
	c ^= b >> 5
	a -= b
	a -= c
	a ^= c >> 3
	b -= c
	b -= a
	b ^= a << 10
	c -= a
	c -= b
	c ^= b >> 15
	return a, b, c
}

func le32(k []byte) uint32 {
	return uint32(k[0]) | uint32(k[1])<<8 | uint32(k[2])<<16 | uint32(k[3])<<24
}

// phash2 is erlang:phash2/1 of a binary: lookup2 over its bytes.
func phash2(key []byte) uint32 {
	if len(key) == 0 {
		return binaryHashSeed % phash2Range
	}
	a, b, c := uint32(goldenRatio), uint32(goldenRatio), uint32(binaryHashSeed)
	k := key
	for len(k) >= 12 {
		a += le32(k[0:])
		b += le32(k[4:])
		c += le32(k[8:])
		a, b, c = mix(a, b, c)
		k = k[12:]
	}
	c += uint32(len(key))
	// The tail's bytes, as lookup2 adds them (c's low byte is the length).
	for i := len(k) - 1; i >= 0; i-- {
		switch {
		case i >= 8:
			c += uint32(k[i]) << (8 * (i - 7))
		case i >= 4:
			b += uint32(k[i]) << (8 * (i - 4))
		default:
			a += uint32(k[i]) << (8 * i)
		}
	}
	_, _, c = mix(a, b, c)
	return c % phash2Range
}

// exs1024 is Erlang's xorshift1024* generator as rand:seed_s(exs1024,
// {K, K, K}) makes it and rand:uniform_s/1 draws from it.
type exs1024 struct {
	s [16]uint64
	p int
}

// xorshift64star is Erlang's exs64 step, which fills exs1024's state.
func xorshift64star(r uint64) (out, next uint64) {
	r ^= r >> 12
	r ^= r << 25
	r ^= r >> 27
	return r * 2685821657736338717, r
}

func seedExs1024(k uint64) *exs1024 {
	const mask21 = 1<<21 - 1
	b1 := ((k&mask21 + 1) * 2097131) & mask21
	b2 := ((k&mask21 + 1) * 2097133) & mask21
	b3 := ((k&mask21 + 1) * 2097143) & mask21
	r := b1<<43 | b2<<22 | b3<<1 | 1
	g := &exs1024{}
	// Erlang builds its list by prepending: the first drawn value ends last.
	for i := 15; i >= 0; i-- {
		g.s[i], r = xorshift64star(r)
	}
	return g
}

// next is one xorshift1024* step over Erlang's list state, read as a
// ring: the state's head and the word after it.
func (g *exs1024) next() uint64 {
	s0 := g.s[g.p]
	g.p = (g.p + 1) % 16
	s1 := g.s[g.p]
	s1 ^= s1 << 31
	s1 ^= s1 >> 11
	s0 ^= s0 >> 30
	g.s[g.p] = s0 ^ s1
	return g.s[g.p] * 1181783497276652981
}

// uniform is rand:uniform_s/1: a float in [0, 1) of 53 bits.
func (g *exs1024) uniform() float64 {
	return float64(g.next()>>11) * (1.0 / (1 << 53))
}

// jumpHash is the exchange's jump consistent hash of key over n buckets.
func jumpHash(key uint32, n int) int {
	if n <= 1 {
		return 0
	}
	g := seedExs1024(uint64(key))
	b, j := -1, 0
	for j < n {
		b = j
		r := g.uniform()
		if r == 0 {
			return b // Erlang would fail dividing by zero: one key in 2^53
		}
		j = int(float64(b+1) / r)
	}
	return b
}

// BucketOf is the bucket of n an x-consistent-hash exchange with n
// buckets routes a message with routing key key to.
func BucketOf(key string, n int) int {
	return jumpHash(phash2([]byte(key)), n)
}
