// Package bindmarker tells each node's DRA driver of the claims it must
// prepare before the scheduler binds their pods. The scheduler allocates
// a device published with binding conditions and waits, before it binds
// the pod, for the node's driver to report them met in the claim's
// status; the node's driver must learn of that allocation first. A watch
// of every ResourceClaim by every node's driver would cost the API server
// one event per claim per node; instead one Marker, running once in the
// cluster, watches the claims, and labels each claim allocated with the
// driver's binding conditions with the node its devices are on
// (NodeLabel), and each node's driver watches the claims of its own label
// value only, a selector the API server applies.
package bindmarker

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// NodeLabel is the label of a claim that names, by NodeValue, the node
// whose driver prepares it before binding: <driver>/prepare-node.
func NodeLabel(driver string) string { return driver + "/prepare-node" }

// NodeValue is node as a value of NodeLabel: the node's name where it is
// a valid label value (63 characters at most), else "h-" and the first 40
// hex digits of its SHA-256, which the node's driver computes alike.
func NodeValue(node string) string {
	if len(validation.IsValidLabelValue(node)) == 0 {
		return node
	}
	sum := sha256.Sum256([]byte(node))
	return "h-" + hex.EncodeToString(sum[:])[:40]
}

// NodeOfPool is the node of a pool of the driver's (<node>/<idPrefix>, or
// the node alone in the driver's versions before a pool per resource).
func NodeOfPool(pool string) string {
	if i := strings.LastIndex(pool, "/"); i >= 0 {
		return pool[:i]
	}
	return pool
}
