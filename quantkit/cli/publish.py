"""`quantkit publish`: upload a verified artifact to the Hugging Face Hub."""

from __future__ import annotations

from pathlib import Path

import click

from ._common import echo_json, json_option


@click.command("publish")
@click.argument("artifact", type=click.Path(file_okay=False))
@click.option("--repo", required=True, help="ORG/NAME on the Hugging Face Hub.")
@click.option("--private", is_flag=True)
@click.option("--revision", default=None, help="Branch to upload to (created if missing).")
@click.option("--dry-run", is_flag=True, help="List what would be uploaded and show the model card; upload nothing.")
@json_option
def publish_cmd(artifact, repo, private, revision, dry_run, as_json):
    """Publish ARTIFACT (it must have passed verification) to the Hub."""
    from ..publish import check_publishable, plan, publish

    path = Path(artifact)
    meta = check_publishable(path)
    files = plan(path)
    if dry_run:
        card = (path / "README.md").read_text()
        if as_json:
            echo_json({"dry_run": True, "repo": repo, "private": private, "revision": revision or "main", "files": files,
                       "bytes": sum(f["bytes"] for f in files), "verification": meta["verification"]["status"], "card": card})
            return
        click.echo(f"would upload to {repo} ({'private' if private else 'public'}, revision {revision or 'main'}):")
        for f in files:
            click.echo(f"  {f['bytes'] / 1e6:10.2f} MB  {f['path']}")
        click.echo(f"  {sum(f['bytes'] for f in files) / 1e6:10.2f} MB  total\n\n--- README.md (model card) ---\n{card}")
        return
    result = publish(path, repo, private=private, revision=revision)
    echo_json(result) if as_json else click.echo(f"published {artifact} -> {result['commit_url']}")


COMMANDS = [publish_cmd]
