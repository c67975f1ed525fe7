package openai

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"unicode/utf8"
)

// The scanner below is the one JSON reader of this package: request summaries, prompts, chunk inspection and
// re-assembly all walk their input with it in a single pass, validating the syntax of everything they skip.
// It never allocates on valid input, and it never recurses: nesting is tracked in a bit stack whose size is fixed
// by the caller, so a body nested 100,000 deep is rejected after maxDepth bytes without touching the Go stack.
//
// Why not github.com/tidwall/gjson, which the module graph already holds: measured in one run on the same machine,
// Summary.Parse of an 8 KB chat body took 23 µs and 0 allocations against 112 µs and 53 allocations for the best
// gjson rendering (ValidBytes, GetManyBytes, ForEach over the messages), and 3.2 ms / 0 against 10.4 ms / 6,041
// for 1 MB. gjson also walks the body once to validate and again per lookup, returns the first of repeated keys
// where every decoder upstream of us takes the last, validates recursively without a depth bound, and accepts
// invalid UTF-8 and unpaired surrogates, which requests must not carry upstream.

const (
	// MaxDepth is the deepest nesting of arrays and objects that Summary.Parse accepts (the top-level object is
	// depth 1). Real requests stay below 20 even with nested JSON-schema tool parameters.
	MaxDepth = 64

	// referenceDepth is encoding/json's nesting limit. AppendPrompt honours it (rather than MaxDepth) so that it
	// accepts every body the encoding/json reference accepts.
	referenceDepth = 10000

	// chunkDepth bounds nesting in upstream output (chunks, error bodies).
	chunkDepth = 128
)

// A SyntaxError reports JSON that is not well formed: bad syntax, truncation, nesting deeper than the limit, or
// (for request bodies) invalid UTF-8 or an unpaired UTF-16 surrogate escape.
type SyntaxError struct {
	Offset int    // byte offset in the input where the problem was found
	Msg    string // what was wrong there
}

// Error returns the message with the offset where the problem was found.
func (e *SyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON at byte %d: %s", e.Offset, e.Msg)
}

// String flags reported by scanner.str.
const (
	strEscaped = 1 << iota // the string holds backslash escapes
	strInvalid             // invalid UTF-8 or an unpaired surrogate escape (lenient scanners only)
)

// scanner validates JSON in b. It is a value type kept on the caller's stack. kinds is the bit stack skip uses
// (bit set: object, clear: array); deep extends it, allocated only for input nested more than 192 levels deep
// (which only AppendPrompt, at encoding/json's limit, accepts).
type scanner struct {
	b        []byte
	strict   bool // reject invalid UTF-8 and unpaired surrogate escapes, as request bodies must
	maxDepth int
	kinds    [3]uint64
	deep     []uint64
}

// kind returns the word of the bit stack that holds level rel.
func (sc *scanner) kind(rel uint) *uint64 {
	w := rel >> 6
	if w < uint(len(sc.kinds)) {
		return &sc.kinds[w]
	}
	if sc.deep == nil {
		sc.deep = make([]uint64, sc.maxDepth>>6+1)
	}
	return &sc.deep[w]
}

func (sc *scanner) errAt(i int, what string) error {
	if i >= len(sc.b) {
		return &SyntaxError{Offset: len(sc.b), Msg: "unexpected end of input"}
	}
	c := sc.b[i]
	if c >= 0x20 && c < 0x7f {
		return &SyntaxError{Offset: i, Msg: fmt.Sprintf("invalid character %q %s", c, what)}
	}
	return &SyntaxError{Offset: i, Msg: fmt.Sprintf("invalid byte 0x%02x %s", c, what)}
}

func (sc *scanner) tooDeep(i int) error {
	return &SyntaxError{Offset: i, Msg: fmt.Sprintf("nesting deeper than %d levels", sc.maxDepth)}
}

// ws returns the index of the first non-whitespace byte at or after i.
func (sc *scanner) ws(i int) int {
	b := sc.b
	for i < len(b) {
		switch b[i] {
		case ' ', '\n', '\r', '\t':
			i++
		default:
			return i
		}
	}
	return i
}

// expect checks that b[i] is c, after whitespace, and returns the index after it.
func (sc *scanner) expect(i int, c byte, what string) (int, error) {
	i = sc.ws(i)
	if i >= len(sc.b) || sc.b[i] != c {
		return i, sc.errAt(i, what)
	}
	return i + 1, nil
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// plain8 reports whether the 8 bytes in x are all printable ASCII other than '"' and '\\', the bytes a JSON
// string scanner can skip without a second look. A byte below 0x20, equal to '"' or '\\', or at or above 0x80
// sets its top bit in one of the terms; a borrow can set the top bit of a later byte too, but only after a real
// hit, so the test has no false negatives and no false positives in a run of plain bytes.
func plain8(x uint64) bool {
	return ((x-lsb*0x20)|((x^(lsb*'"'))-lsb)|((x^(lsb*'\\'))-lsb)|x)&msb == 0
}

// str scans the string whose opening quote is at b[i]. It returns the index after the closing quote and flags.
func (sc *scanner) str(i int) (int, uint8, error) {
	b := sc.b
	j := i + 1
	var flags uint8
	for {
		for j+8 <= len(b) && plain8(binary.LittleEndian.Uint64(b[j:])) {
			j += 8
		}
		if j >= len(b) {
			return j, flags, sc.errAt(j, "")
		}
		c := b[j]
		switch {
		case c == '"':
			return j + 1, flags, nil
		case c == '\\':
			flags |= strEscaped
			if j+1 >= len(b) {
				return j, flags, sc.errAt(j+1, "")
			}
			switch b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
			case 'u':
				r, ok := hex4(b[j+2:])
				if !ok {
					return j, flags, sc.errAt(j, "in \\u escape")
				}
				j += 6
				if r >= 0xd800 && r < 0xe000 {
					if r < 0xdc00 && j+6 <= len(b) && b[j] == '\\' && b[j+1] == 'u' {
						if r2, ok := hex4(b[j+2:]); ok && r2 >= 0xdc00 && r2 < 0xe000 {
							j += 6
							continue
						}
					}
					if sc.strict {
						return j, flags, &SyntaxError{Offset: j - 6, Msg: "invalid Unicode escape: unpaired surrogate"}
					}
					flags |= strInvalid
				}
			default:
				return j, flags, sc.errAt(j+1, "in string escape code")
			}
		case c < 0x20:
			return j, flags, sc.errAt(j, "in string literal")
		case c < utf8.RuneSelf:
			j++
		default:
			r, size := utf8.DecodeRune(b[j:])
			if r == utf8.RuneError && size == 1 {
				if sc.strict {
					return j, flags, &SyntaxError{Offset: j, Msg: "invalid UTF-8 in string"}
				}
				flags |= strInvalid
			}
			j += size
		}
	}
}

// hex4 decodes four hex digits at the start of b.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// number scans the number starting at b[i] (JSON grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?).
func (sc *scanner) number(i int) (int, error) {
	b := sc.b
	j := i
	if j < len(b) && b[j] == '-' {
		j++
	}
	switch {
	case j >= len(b):
		return j, sc.errAt(j, "")
	case b[j] == '0':
		j++
	case '1' <= b[j] && b[j] <= '9':
		j++
		for j < len(b) && '0' <= b[j] && b[j] <= '9' {
			j++
		}
	default:
		return j, sc.errAt(j, "looking for beginning of value")
	}
	if j < len(b) && b[j] == '.' {
		j++
		if j >= len(b) || b[j] < '0' || b[j] > '9' {
			return j, sc.errAt(j, "after decimal point in numeric literal")
		}
		for j < len(b) && '0' <= b[j] && b[j] <= '9' {
			j++
		}
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		j++
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		if j >= len(b) || b[j] < '0' || b[j] > '9' {
			return j, sc.errAt(j, "in exponent of numeric literal")
		}
		for j < len(b) && '0' <= b[j] && b[j] <= '9' {
			j++
		}
	}
	return j, nil
}

// literal scans true, false or null at b[i].
func (sc *scanner) literal(i int) (int, error) {
	b := sc.b
	var lit string
	switch b[i] {
	case 't':
		lit = "true"
	case 'f':
		lit = "false"
	default:
		lit = "null"
	}
	for k := 1; k < len(lit); k++ {
		if i+k >= len(b) || b[i+k] != lit[k] {
			return i + k, sc.errAt(i+k, "in literal "+lit)
		}
	}
	return i + len(lit), nil
}

// key scans an object key at b[i] (after whitespace) and the colon after it. It returns the key's raw bytes
// (between the quotes, escapes not decoded), its flags and the index after the colon.
func (sc *scanner) key(i int) ([]byte, uint8, int, error) {
	i = sc.ws(i)
	if i >= len(sc.b) || sc.b[i] != '"' {
		return nil, 0, i, sc.errAt(i, "looking for beginning of object key string")
	}
	end, flags, err := sc.str(i)
	if err != nil {
		return nil, 0, end, err
	}
	j, err := sc.expect(end, ':', "after object key")
	return sc.b[i+1 : end-1], flags, j, err
}

// next handles what follows a member or element of a container closed by c: it returns the index after a comma
// and more=true, or the index after c and more=false.
func (sc *scanner) next(i int, c byte) (int, bool, error) {
	i = sc.ws(i)
	if i < len(sc.b) {
		switch sc.b[i] {
		case ',':
			return i + 1, true, nil
		case c:
			return i + 1, false, nil
		}
	}
	if c == '}' {
		return i, false, sc.errAt(i, "after object key:value pair")
	}
	return i, false, sc.errAt(i, "after array element")
}

// open checks the container starting at b[i] against the depth limit and reports whether it is empty; it returns
// the index after the opening bracket (or after the closing one, when empty).
func (sc *scanner) open(i, depth int) (int, bool, error) {
	if depth > sc.maxDepth {
		return i, false, sc.tooDeep(i)
	}
	close := byte(']')
	if sc.b[i] == '{' {
		close = '}'
	}
	j := sc.ws(i + 1)
	if j >= len(sc.b) {
		return j, false, sc.errAt(j, "")
	}
	if sc.b[j] == close {
		return j + 1, true, nil
	}
	return j, false, nil
}

// skip validates the value starting at or after b[i] (after whitespace) and returns the index just past it.
// depth is the nesting depth of the container holding the value (0 at the top level).
func (sc *scanner) skip(i, depth int) (int, error) {
	b := sc.b
	base := depth
	var err error
	for {
		// A value starts at i.
		i = sc.ws(i)
		if i >= len(b) {
			return i, sc.errAt(i, "")
		}
		switch c := b[i]; c {
		case '{', '[':
			depth++
			if depth > sc.maxDepth {
				return i, sc.tooDeep(i)
			}
			rel := uint(depth - base - 1)
			if c == '{' {
				*sc.kind(rel) |= 1 << (rel & 63)
			} else {
				*sc.kind(rel) &^= 1 << (rel & 63)
			}
			j := sc.ws(i + 1)
			if j < len(b) && b[j] == c+2 { // '{'+2 == '}', '['+2 == ']'
				i = j + 1
				depth--
				break
			}
			if c == '[' {
				i = j
				continue
			}
			if _, _, i, err = sc.key(j); err != nil {
				return i, err
			}
			continue
		case '"':
			if i, _, err = sc.str(i); err != nil {
				return i, err
			}
		case 't', 'f', 'n':
			if i, err = sc.literal(i); err != nil {
				return i, err
			}
		default:
			if i, err = sc.number(i); err != nil {
				return i, err
			}
		}
		// A value ended at i: close containers until one continues.
		for {
			if depth == base {
				return i, nil
			}
			rel := uint(depth - base - 1)
			obj := *sc.kind(rel)&(1<<(rel&63)) != 0
			close := byte(']')
			if obj {
				close = '}'
			}
			var more bool
			if i, more, err = sc.next(i, close); err != nil {
				return i, err
			}
			if more {
				if obj {
					if _, _, i, err = sc.key(i); err != nil {
						return i, err
					}
				}
				break
			}
			depth--
		}
	}
}

// end checks that only whitespace follows the top-level value ending at i.
func (sc *scanner) end(i int) error {
	i = sc.ws(i)
	if i < len(sc.b) {
		return sc.errAt(i, "after top-level value")
	}
	return nil
}

// appendUnescaped appends the decoded content of a JSON string (raw is what lies between the quotes) to dst,
// exactly as encoding/json decodes it: invalid UTF-8 bytes and unpaired surrogate escapes become U+FFFD.
func appendUnescaped(dst, raw []byte, flags uint8) []byte {
	if flags == 0 {
		return append(dst, raw...)
	}
	invalid := flags&strInvalid != 0
	for len(raw) > 0 {
		k := bytes.IndexByte(raw, '\\')
		if k < 0 {
			k = len(raw)
		}
		dst = appendRun(dst, raw[:k], invalid)
		raw = raw[k:]
		if len(raw) == 0 {
			break
		}
		// raw[0] == '\\'; the scanner validated the escape.
		switch c := raw[1]; c {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, _ := hex4(raw[2:])
			raw = raw[6:]
			if r >= 0xd800 && r < 0xe000 {
				if r < 0xdc00 && len(raw) >= 6 && raw[0] == '\\' && raw[1] == 'u' {
					if r2, ok := hex4(raw[2:]); ok && r2 >= 0xdc00 && r2 < 0xe000 {
						dst = utf8.AppendRune(dst, (r-0xd800)<<10|(r2-0xdc00)+0x10000)
						raw = raw[6:]
						continue
					}
				}
				r = utf8.RuneError
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default: // '"', '\\', '/'
			dst = append(dst, c)
		}
		raw = raw[2:]
	}
	return dst
}

// appendRun appends unescaped string bytes, replacing invalid UTF-8 byte by byte as encoding/json does.
func appendRun(dst, run []byte, invalid bool) []byte {
	if !invalid {
		return append(dst, run...)
	}
	for len(run) > 0 {
		if run[0] < utf8.RuneSelf {
			dst = append(dst, run[0])
			run = run[1:]
			continue
		}
		r, size := utf8.DecodeRune(run)
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, "\uFFFD"...)
		} else {
			dst = append(dst, run[:size]...)
		}
		run = run[size:]
	}
	return dst
}

// maxKeyLen bounds the keys this package matches: a longer key is never one of ours, even fully \u-escaped
// ("max_completion_tokens" is 21 bytes, 126 escaped).
const maxKeyLen = 128

// keyName returns the decoded key for matching: raw itself when it has no escapes, else its decoding in buf.
// Keys that cannot match any name this package knows come back undecoded.
func keyName(raw []byte, flags uint8, buf *[maxKeyLen]byte) []byte {
	if flags == 0 || flags&strInvalid != 0 || len(raw) > maxKeyLen {
		return raw
	}
	return appendUnescaped(buf[:0], raw, flags)
}

// parseInt parses a JSON number that must be a non-negative integer no larger than max. ok is false for a
// fraction, an exponent, a negative number or one above max.
func parseInt(num []byte, max int) (n int, ok bool) {
	if len(num) == 0 || len(num) > 18 {
		return 0, false
	}
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, n <= max
}

// A field is a request member the gateway acts on: it routes by it, admits by it, rewrites it or reserves tokens
// by it. Summary.Parse and ParseGeneric refuse a body in which one of them is ambiguous, because the decoders
// upstream do not agree on which occurrence or which spelling counts (docs/security.md, "Request fields").
type field uint8

const (
	fieldNone field = iota
	fieldModel
	fieldStream
	fieldStreamOptions
	fieldMaxTokens
	fieldMaxCompletionTokens
	fieldMaxOutputTokens
	fieldN
	fieldBestOf
	fieldUser
	fieldPriority
	fieldPreviousResponseID
	fieldBackground
	fieldIncludeUsage // a member of stream_options, not of the top level
	numFields
)

// fieldNames spells each field as the APIs do.
var fieldNames = [numFields]string{"", "model", "stream", "stream_options", "max_tokens", "max_completion_tokens",
	"max_output_tokens", "n", "best_of", "user", "priority", "previous_response_id", "background", "include_usage"}

// maxFieldLen is the longest name in fieldNames.
const maxFieldLen = len("max_completion_tokens")

// fieldLens has bit n set when a key of n bytes can be equal to a field name under case folding: the name's
// length, up to 2 more for each 'k' (the Kelvin sign U+212A is 3 bytes) and 1 more for each 's' (U+017F, 2 bytes).
var fieldLens = func() uint32 {
	var m uint32
	for _, name := range fieldNames[1:] {
		extra := 2*strings.Count(name, "k") + strings.Count(name, "s")
		for n := len(name); n <= len(name)+extra; n++ {
			m |= 1 << n
		}
	}
	return m
}()

// fieldFirst has bit c set for each byte c that can begin a key equal to a field name under case folding: the
// names' first letters in both cases, and 0xc5, the first byte of U+017F (a folded 's').
var fieldFirst = func() (set [4]uint64) {
	for _, name := range fieldNames[1:] {
		for _, c := range []byte{name[0], name[0] - ('a' - 'A')} {
			set[c>>6] |= 1 << (c & 63)
		}
		if name[0] == 's' {
			set[0xc5>>6] |= 1 << (0xc5 & 63)
		}
	}
	return set
}()

// foldField returns the field whose name equals key under the case folding encoding/json applies to member names
// (bytes.EqualFold: Unicode simple folding), and whether key is spelled exactly as the name; fieldNone when key
// is no field's name. key is a decoded key (keyName). It does not allocate, and rejects most keys on their first
// byte and length alone.
//
// The names are lower-case ASCII, so a key equals one under folding when each of its bytes is the name's byte or
// its upper-case form, or it holds one of the only two non-ASCII runes whose fold orbit contains an ASCII letter:
// U+212A KELVIN SIGN (K, k) and U+017F LATIN SMALL LETTER LONG S (S, s); TestFoldOrbits checks that claim against
// the whole of Unicode.
func foldField(key []byte) (field, bool) {
	n := len(key)
	if n == 0 || n >= 32 || fieldLens&(1<<n) == 0 || fieldFirst[key[0]>>6]&(1<<(key[0]&63)) == 0 {
		return fieldNone, false
	}
	folded := false
	for _, c := range key {
		if c-'A' < 26 || c >= utf8.RuneSelf {
			folded = true
			break
		}
	}
	if !folded { // the common case: lower-case ASCII, a field only if spelled exactly
		f := fieldByName(key)
		return f, f != fieldNone
	}
	var buf [maxFieldLen]byte
	m := 0
	for i := 0; i < n; {
		c := key[i]
		switch {
		case c < utf8.RuneSelf:
			if c-'A' < 26 {
				c += 'a' - 'A'
			}
			i++
		case c == 0xe2 && i+3 <= n && key[i+1] == 0x84 && key[i+2] == 0xaa: // U+212A
			c = 'k'
			i += 3
		case c == 0xc5 && i+2 <= n && key[i+1] == 0xbf: // U+017F
			c = 's'
			i += 2
		default:
			return fieldNone, false
		}
		if m == len(buf) {
			return fieldNone, false
		}
		buf[m] = c
		m++
	}
	return fieldByName(buf[:m]), false
}

// fieldByName returns the field named name exactly, or fieldNone.
func fieldByName(name []byte) field {
	switch string(name) {
	case "model":
		return fieldModel
	case "stream":
		return fieldStream
	case "stream_options":
		return fieldStreamOptions
	case "max_tokens":
		return fieldMaxTokens
	case "max_completion_tokens":
		return fieldMaxCompletionTokens
	case "max_output_tokens":
		return fieldMaxOutputTokens
	case "n":
		return fieldN
	case "best_of":
		return fieldBestOf
	case "user":
		return fieldUser
	case "priority":
		return fieldPriority
	case "previous_response_id":
		return fieldPreviousResponseID
	case "background":
		return fieldBackground
	case "include_usage":
		return fieldIncludeUsage
	}
	return fieldNone
}

// fieldSet records the fields met in one object.
type fieldSet uint16

// add records the field of key, a member of the object being scanned (stream_options when nested, else the top
// level), and returns it with the message to refuse the body with when key makes it ambiguous: a second
// occurrence of the field, or a spelling in another case. Keys of no field, and keys naming a field of the other
// level, return fieldNone and "".
func (fs *fieldSet) add(key []byte, nested bool) (field, string) {
	f, exact := foldField(key)
	if f == fieldNone || (f == fieldIncludeUsage) != nested {
		return fieldNone, ""
	}
	if exact && *fs&(1<<f) == 0 {
		*fs |= 1 << f
		return f, ""
	}
	*fs |= 1 << f
	return f, fmt.Sprintf("duplicate or case-variant key %q for %q", string(key), fieldNames[f])
}
