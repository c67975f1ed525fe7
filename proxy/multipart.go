package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/textproto"

	"github.com/switchyard/switchyard/openai"
)

// Multipart bodies (the audio endpoints' forms). The gateway reads only the "model" and "stream" fields to
// route the request; the file parts are skipped unread, and the body goes upstream as the client sent it,
// unless the route renames the model (appendFormRenamed).

// maxFormField bounds the value of a form field the gateway reads.
const maxFormField = 1 << 10

// parseForm reads the model and stream fields of a multipart/form-data body.
func parseForm(body, contentType []byte) (model []byte, stream bool, err error) {
	boundary, err := formBoundary(contentType)
	if err != nil {
		return nil, false, err
	}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			return model, stream, nil
		}
		if err != nil {
			return nil, false, &openai.RequestError{Message: "the multipart body is malformed: " + err.Error()}
		}
		name := p.FormName()
		if name != "model" && name != "stream" {
			continue
		}
		v, err := io.ReadAll(io.LimitReader(p, maxFormField+1))
		if err != nil || len(v) > maxFormField {
			return nil, false, &openai.RequestError{Param: name, Message: fmt.Sprintf("the form field %s is malformed or longer than %d bytes", name, maxFormField)}
		}
		if name == "model" {
			model = v
		} else {
			stream = string(bytes.TrimSpace(v)) == "true"
		}
	}
}

func formBoundary(contentType []byte) (string, error) {
	_, params, err := mime.ParseMediaType(string(contentType))
	if err != nil || params["boundary"] == "" {
		return "", &openai.RequestError{Message: "a multipart/form-data body needs a boundary in its Content-Type"}
	}
	return params["boundary"], nil
}

// appendFormRenamed appends a copy of the form body to dst with its model field set to model, under the same
// boundary (so the client's Content-Type still describes it). Every other part is copied as it is.
func appendFormRenamed(dst, body, contentType []byte, model string) ([]byte, error) {
	boundary, err := formBoundary(contentType)
	if err != nil {
		return dst, err
	}
	buf := bytes.NewBuffer(dst)
	w := multipart.NewWriter(buf)
	if err := w.SetBoundary(boundary); err != nil {
		return dst, fmt.Errorf("proxy: form: %w", err)
	}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	for {
		p, err := mr.NextRawPart() // raw: copied as the client encoded it
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return dst, fmt.Errorf("proxy: form: %w", err)
		}
		h := make(textproto.MIMEHeader, len(p.Header))
		for k, v := range p.Header {
			h[k] = v
		}
		pw, err := w.CreatePart(h)
		if err != nil {
			return dst, fmt.Errorf("proxy: form: %w", err)
		}
		if p.FormName() == "model" {
			_, err = io.WriteString(pw, model)
		} else {
			_, err = io.Copy(pw, p)
		}
		if err != nil {
			return dst, fmt.Errorf("proxy: form: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return dst, fmt.Errorf("proxy: form: %w", err)
	}
	return buf.Bytes(), nil
}
