# Multi-stage build of the cdi-device-plugin image.
#
#   docker build -t cdi-device-plugin:latest --build-arg VERSION="$(git describe --tags --always --dirty)" .
#
# The result is three static binaries on distroless/static: the plugin (the
# entrypoint) and the DRA driver (/cdi-dra-driver), running as root (uid 0):
# they own the host directories they write, and create device nodes with
# mknod, which needs CAP_MKNOD alone, not a privileged container (see
# deploy/README.md, "Capabilities"); and the DRA driver's controller
# (/cdi-dra-controller, once per cluster), which only talks to the API
# server and runs as a non-root user its Deployment names.

ARG GO_IMAGE=golang:1.26-bookworm
ARG BASE_IMAGE=gcr.io/distroless/static-debian12

FROM ${GO_IMAGE} AS build
WORKDIR /src

# Module downloads get their own layer, so they are reused while only the
# sources change.
COPY go.mod go.sum ./
RUN go mod download

COPY . .

ARG VERSION=dev
# Set automatically by BuildKit / buildx (docker build --platform ...);
# empty with the legacy builder, in which case Go builds for the build host.
ARG TARGETOS
ARG TARGETARCH
RUN CGO_ENABLED=0 GOOS="${TARGETOS:-linux}" GOARCH="${TARGETARCH}" \
    go build -trimpath -tags grpcnotrace -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/ ./cmd/cdi-device-plugin ./cmd/cdi-dra-driver ./cmd/cdi-dra-controller

# The root variant of distroless/static on purpose (not :nonroot): mknod in /dev
# needs uid 0.
FROM ${BASE_IMAGE}
COPY --from=build /out/cdi-device-plugin /cdi-device-plugin
# The DRA driver, same configuration and devices (command: /cdi-dra-driver).
COPY --from=build /out/cdi-dra-driver /cdi-dra-driver
# The driver's controller, one per cluster (command: /cdi-dra-controller):
# it labels the claims to prepare before binding with their node.
COPY --from=build /out/cdi-dra-controller /cdi-dra-controller
USER 0:0
ENTRYPOINT ["/cdi-device-plugin"]
