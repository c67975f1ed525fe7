package sim

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// textSeed is the seed of one request's generated text: the backend's seed and the canonical prompt, so the same
// request gives the same text on every backend that shares the seed and on every run, and a longer max_tokens
// only extends it.
func textSeed(seed uint64, prompt []byte) uint64 {
	var d xxhash.Digest
	d.Reset()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	_, _ = d.Write(b[:])
	_, _ = d.Write(prompt)
	return d.Sum64()
}

// word returns the text of token i of the text seeded by seed: a word, with a leading space after the first.
// It does not allocate.
func word(seed uint64, i int) string {
	// splitmix64 of (seed, i): cheap, and every token's word is independent of the others.
	z := seed + uint64(i+1)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	w := spacedWords[z>>56]
	if i == 0 {
		return w[1:]
	}
	return w
}

// AppendText appends the first n tokens of the text generated for prompt under seed: the exact content a
// simulated backend with that Seed returns for a request whose canonical prompt is prompt and whose max_tokens
// is n. Tests compare text through the gateway with it.
func AppendText(dst []byte, seed uint64, prompt []byte, n int) []byte {
	ts := textSeed(seed, prompt)
	for i := range n {
		dst = append(dst, word(ts, i)...)
	}
	return dst
}

var spacedWords = func() (sw [256]string) {
	for i, w := range words {
		sw[i] = " " + w
	}
	return sw
}()
