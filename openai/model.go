package openai

import (
	"bytes"
	"unicode/utf8"
)

// AppendRenamedModel appends raw to dst with the model an answer names changed from from to to: a route that
// maps a public model name to another upstream name gives the client back the name it asked for. raw is the
// bytes to copy (an SSE event, or a whole body) and data the JSON object inside it (a subslice of raw, or raw
// itself). The members renamed are the string "model" members of data's top level, of a top-level "response"
// object (Responses API events: {"type":"response.created","response":{"model":...}}) and of a top-level
// "message" object (Anthropic's message_start) whose decoded value equals from; each value is replaced by to,
// quoted with AppendQuoted, and every other byte of raw is copied as it was.
//
// Keys and values are compared decoded, so any spacing, member order and escapes ("m\u006fdel", "gpt\u002d4")
// match. Nothing else is touched: a "model" key inside a string, a message, tool arguments or any deeper object
// is content. Data that is not a well-formed JSON object is appended unchanged, and so is raw when data is not a
// subslice of it (taken by ordinary slicing: one whose capacity was cut by a full slice expression cannot be
// told from a copy). It validates data in one scan and does not allocate when dst has room, for data nested at
// most 192 levels deep (encoding/json's limit of 10,000 levels applies).
func AppendRenamedModel(dst, raw, data []byte, from, to string) []byte {
	off, ok := subslice(raw, data)
	if !ok || bytes.IndexByte(data, '\\') < 0 && !bytes.Contains(data, []byte(`"model"`)) {
		return append(dst, raw...)
	}
	n0 := len(dst)
	r := renamer{sc: scanner{b: data, maxDepth: referenceDepth}, from: from, to: to, dst: append(dst, raw[:off]...)}
	i := r.sc.ws(0)
	if i >= len(data) || data[i] != '{' {
		return append(dst[:n0], raw...)
	}
	end, err := r.object(i, 1, true)
	if err == nil {
		err = r.sc.end(end)
	}
	if err != nil {
		return append(r.dst[:n0], raw...)
	}
	dst = append(r.dst, data[r.last:]...)
	return append(dst, raw[off+len(data):]...)
}

// subslice returns the offset of data in raw, when data is a non-empty subslice of raw.
func subslice(raw, data []byte) (int, bool) {
	off := cap(raw) - cap(data)
	if len(data) == 0 || off < 0 || off > len(raw)-len(data) {
		return 0, false
	}
	return off, &raw[off] == &data[0]
}

// renamer copies the data a scanner walks to dst, renaming model members on the way.
type renamer struct {
	sc       scanner
	from, to string
	dst      []byte
	last     int // sc.b[last:] is not copied yet
}

// object walks the object at b[i], at depth, renaming its "model" members, and those of its "response" and
// "message" objects when top. It returns the index after the object.
func (r *renamer) object(i, depth int, top bool) (int, error) {
	sc, b := &r.sc, r.sc.b
	i, empty, err := sc.open(i, depth)
	if err != nil || empty {
		return i, err
	}
	for {
		raw, flags, v, err := sc.key(i)
		if err != nil {
			return v, err
		}
		if v = sc.ws(v); v >= len(b) {
			return v, sc.errAt(v, "")
		}
		var buf [maxKeyLen]byte
		var end int
		switch k := keyName(raw, flags, &buf); {
		case string(k) == "model" && b[v] == '"':
			var sflags uint8
			if end, sflags, err = sc.str(v); err == nil && decodedEqual(b[v+1:end-1], sflags, r.from) {
				r.dst = append(r.dst, b[r.last:v]...)
				r.dst = AppendQuoted(r.dst, r.to)
				r.last = end
			}
		case top && b[v] == '{' && (string(k) == "response" || string(k) == "message"):
			end, err = r.object(v, depth+1, false)
		default:
			end, err = sc.skip(v, depth)
		}
		if err != nil {
			return end, err
		}
		var more bool
		if i, more, err = sc.next(end, '}'); err != nil || !more {
			return i, err
		}
	}
}

// decodedEqual reports whether the contents of a JSON string (raw, between the quotes, with the flags the
// scanner gave it) decode to s, as encoding/json decodes them. It decodes one escape or character at a time,
// into a buffer on the stack.
func decodedEqual(raw []byte, flags uint8, s string) bool {
	if flags == 0 {
		return string(raw) == s
	}
	if len(raw) > 6*len(s) { // a decoded byte takes at most six raw ones (\u0041)
		return false
	}
	for len(raw) > 0 {
		n := 1
		switch {
		case raw[0] == '\\' && raw[1] == 'u':
			n = 6
			if r, _ := hex4(raw[2:]); r >= 0xd800 && r < 0xdc00 && len(raw) >= 12 && raw[6] == '\\' && raw[7] == 'u' {
				n = 12 // a surrogate pair, or an unpaired high surrogate and the escape after it
			}
		case raw[0] == '\\':
			n = 2
		case raw[0] >= utf8.RuneSelf:
			_, n = utf8.DecodeRune(raw)
		}
		var buf [8]byte // two runes of at most three bytes (U+FFFD, or one from a \u escape), or one of four
		d := appendUnescaped(buf[:0], raw[:n], flags)
		if len(d) > len(s) || string(d) != s[:len(d)] {
			return false
		}
		s, raw = s[len(d):], raw[n:]
	}
	return s == ""
}
