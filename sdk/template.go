package sdk

import (
	"context"
	"fmt"
	"io"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/sdk/chunked"
)

// CreateTemplate creates an empty Template id, with labels; its first
// imported revision becomes its default.
func (c *Client) CreateTemplate(ctx context.Context, id string, labels map[string]string) (*ctrlv1.Template, error) {
	resp, err := c.templates().CreateTemplate(ctx, connect.NewRequest(&ctrlv1.CreateTemplateRequest{
		Command: commandMetadata(""), TemplateId: id, Labels: labels,
	}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetTemplate(), nil
}

// ImportOptions describe a Template import.
type ImportOptions struct {
	// SetDefault makes the imported revision the Template's default.
	SetDefault bool
	// Format is the archive's format; UNSPECIFIED is a docker tarball
	// (docker save). Only for ImportTemplate.
	Format ctrlv1.ImageArchiveFormat
	// Credentials authenticate a registry pull; nil pulls anonymously.
	// Only for ImportTemplateFromRegistry.
	Credentials *ctrlv1.RegistryCredentials
	// Platform chooses the image of a multi-platform reference, as
	// os/arch[/variant]; empty is the hosts'. Only for
	// ImportTemplateFromRegistry.
	Platform string
}

// ImportTemplate imports the image archive r as a revision of the existing
// Template id, streaming it in chunks of ChunkSize.
func (c *Client) ImportTemplate(ctx context.Context, id string, r io.Reader, o ImportOptions) (*ctrlv1.ImportTemplateRevisionResponse, error) {
	format := o.Format
	if format == ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_UNSPECIFIED {
		format = ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_TARBALL
	}
	return c.importTemplate(ctx, &ctrlv1.ImportTemplateRevisionStart{
		TemplateId: id, SetDefault: o.SetDefault,
		Source: &ctrlv1.ImportTemplateRevisionStart_Archive{Archive: format},
	}, r)
}

// ImportTemplateFromRegistry makes the server pull ref (such as
// docker.io/library/debian:12) as a revision of the existing Template id.
func (c *Client) ImportTemplateFromRegistry(ctx context.Context, id, ref string, o ImportOptions) (*ctrlv1.ImportTemplateRevisionResponse, error) {
	return c.importTemplate(ctx, &ctrlv1.ImportTemplateRevisionStart{
		TemplateId: id, SetDefault: o.SetDefault, RegistryCredentials: o.Credentials, Platform: o.Platform,
		Source: &ctrlv1.ImportTemplateRevisionStart_RegistryReference{RegistryReference: ref},
	}, nil)
}

// importTemplate is one ImportTemplateRevision call: start, then r's bytes
// when r is set. An error reading r abandons the call.
func (c *Client) importTemplate(ctx context.Context, start *ctrlv1.ImportTemplateRevisionStart, r io.Reader) (*ctrlv1.ImportTemplateRevisionResponse, error) {
	start.Command = commandMetadata("")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream := c.templates().ImportTemplateRevision(ctx)
	err := stream.Send(&ctrlv1.ImportTemplateRevisionRequest{Part: &ctrlv1.ImportTemplateRevisionRequest_Start{Start: start}})
	if err == nil && r != nil {
		var rerr error
		_, rerr, err = chunked.Send(r, ChunkSize, func(chunk []byte) error {
			return stream.Send(&ctrlv1.ImportTemplateRevisionRequest{Part: &ctrlv1.ImportTemplateRevisionRequest_Chunk{Chunk: chunk}})
		})
		if rerr != nil {
			return nil, fmt.Errorf("reading the image archive: %w", rerr)
		}
	}
	return chunked.Receive(stream, err)
}
