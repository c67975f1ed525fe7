# syntax=docker/dockerfile:1
# Multi-stage build: a static switchyard binary in a distroless image that runs as a non-root user.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/switchyard ./cmd/switchyard

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/switchyard /usr/local/bin/switchyard
COPY config.yaml /etc/switchyard/config.yaml
USER 65532:65532
# 8080: client API (OpenAI-compatible); 9090: admin (/metrics, /healthz, /readyz, /debug/backends)
EXPOSE 8080 9090
ENTRYPOINT ["switchyard"]
CMD ["serve", "-config", "/etc/switchyard/config.yaml"]
