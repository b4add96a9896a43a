# The sas image: the service binaries and sasctl, nothing else (no demo
# service, no fault harness). Static build, distroless base, non-root user.
#   docker build -t sas .                  the services and sasctl
#   docker build --target demo -t sas-demo .   the demo remote service and the chaos harness
FROM golang:1.26.8 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ \
	./cmd/submitter ./cmd/scheduler ./cmd/agent ./cmd/supervisor ./cmd/console ./cmd/api ./cmd/sasctl
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /demo/ ./cmd/remote ./cmd/chaos

# The demo remote service and the chaos harness, with sasctl for the
# healthcheck (sasctl probe: the image has no shell).
FROM gcr.io/distroless/static-debian12:nonroot AS demo
COPY --from=build /demo/ /usr/local/bin/
COPY --from=build /out/sasctl /usr/local/bin/
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/remote"]

# The default target, last: the services and sasctl.
FROM gcr.io/distroless/static-debian12:nonroot AS sas
COPY --from=build /out/ /usr/local/bin/
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/sasctl"]
