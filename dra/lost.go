package dra

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cdi-device-plugin/cdi-device-plugin/podresources"
)

// lostTimeout bounds the PodResources List of checkNotLost.
const lostTimeout = 5 * time.Second

// checkNotLost tells a first start from a lost checkpoint, when Load
// found no file: the prepared claims of the driver leave traces on the
// node that the checkpoint's loss does not take with it: their CDI specs
// (specs), their device metadata specs (metadata) and, while their
// containers run, the kubelet's PodResources (podres). A checkpoint taken
// for empty would have the driver remove those specs (containers of the
// claims could then not start again) and prepare their devices for other
// claims: with any trace the start is refused (ErrCheckpointLost), naming
// the claims and files and what to do. With none it is a first start, and
// the empty checkpoint is saved at once: a driver killed in its first
// Prepare, between a claim's spec and the checkpoint's first write, is
// then not taken for one that lost its checkpoint. A PodResources that
// fails (not one that is absent: no kubelet, or not mounted) refuses the
// start too, to be tried again.
func checkNotLost(ctx context.Context, cp *Checkpoint, specs *claimSpecs, metadata *metadataFiles, podres *podresources.Client,
	node string, log *logrus.Entry) error {
	if !cp.Missing() {
		return nil
	}
	var claims, files []string
	found, err := specs.writer.ClaimSpecs(specs.kind)
	if err != nil {
		return fmt.Errorf("claim checkpoint %s is missing, and the claims' CDI specs cannot be listed: %w", cp.Path(), err)
	}
	for _, s := range found {
		claims = append(claims, claimOrUID(s.Claim, s.UID))
		files = append(files, s.Path)
	}
	meta, err := filepath.Glob(filepath.Join(metadata.cdiDir, metadata.driver+"_metadata_*.json"))
	if err != nil {
		return fmt.Errorf("claim checkpoint %s is missing, and the claims' device metadata specs cannot be listed: %w", cp.Path(), err)
	}
	files = append(files, meta...)
	for _, p := range meta {
		uid, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(p), metadata.driver+"_metadata_"), "_")
		claims = append(claims, claimOrUID("", uid))
	}
	lctx, cancel := context.WithTimeout(ctx, lostTimeout)
	defer cancel()
	res, err := podres.List(lctx)
	switch {
	case errors.Is(err, podresources.ErrNoSocket):
		log.WithError(err).Warn("no claim checkpoint, and no PodResources to tell whether containers hold claims of the driver")
	case err != nil:
		return fmt.Errorf("claim checkpoint %s is missing, and PodResources cannot tell whether containers hold claims of the driver "+
			"(a first start, or a lost checkpoint?): %w", cp.Path(), err)
	default:
		for _, c := range res.Claims() {
			if c.Driver == metadata.driver {
				claims = append(claims, c.Claim+" (PodResources lists it on a container)")
			}
		}
	}
	if len(claims) == 0 {
		if err := cp.Save(map[types.UID]PreparedClaim{}); err != nil {
			return err
		}
		log.WithField("checkpoint", cp.Path()).Info("no claim checkpoint and no prepared claim on the node: a first start; checkpoint created")
		return nil
	}
	what := "restore it from a backup and start the driver again; or, once no pod on node " + node + " uses these claims " +
		"(the kubelet cannot unprepare them while the driver is down: delete their pods)"
	if len(files) > 0 {
		what += ", remove " + strings.Join(files, " ")
	}
	what += " and start the driver again: it then starts with no claims"
	return fmt.Errorf("%w: %s is gone, but the node holds prepared claims of %s: %s; starting without them would remove their CDI specs "+
		"(their containers could not start again) and prepare their devices for other claims: %s",
		ErrCheckpointLost, cp.Path(), metadata.driver, strings.Join(claims, ", "), what)
}

// claimOrUID names a claim by its namespace/name when known, else by UID.
func claimOrUID(claim, uid string) string {
	if claim != "" {
		return claim
	}
	return "claim UID " + uid
}
