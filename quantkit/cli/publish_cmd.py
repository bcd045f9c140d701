"""`quantkit publish`: upload a verified artifact to the Hugging Face Hub."""

from __future__ import annotations

import click

from quantkit.cli._common import MODEL, echo_json, json_option


@click.command("publish")
@click.argument("artifact", type=MODEL)
@click.option("--repo", required=True, help="ORG/NAME on the Hugging Face Hub.")
@click.option("--private", is_flag=True, help="Create the repo private; refused when the repo exists and is public.")
@click.option("--revision", default=None, help="Branch to upload to (created if missing).")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Run every local check (repo id, verification, each file's sha256), list what "
    "would be uploaded and show the model card; contact nothing, upload nothing.",
)
@json_option
def publish_cmd(artifact, repo, private, revision, dry_run, as_json):
    """Publish ARTIFACT (it must have passed verification and still match its sha256 manifest) to the Hub."""
    from quantkit.artifacts.publish import check_publishable, check_repo, plan, publish
    from quantkit.models.resolve import resolve_path

    path = resolve_path(artifact, check=False)  # check_publishable checks it against its manifest
    if not dry_run:
        result = publish(path, repo, private=private, revision=revision)
        echo_json(result) if as_json else click.echo(f"published {artifact} -> {result['commit_url']}")
        return
    check_repo(repo)
    meta = check_publishable(path)
    files = plan(path, meta)
    card = (path / "README.md").read_text(errors="replace")
    if as_json:
        echo_json(
            {
                "dry_run": True,
                "repo": repo,
                "private": private,
                "revision": revision or "main",
                "files": files,
                "bytes": sum(f["bytes"] for f in files),
                "verification": meta["verification"]["status"],
                "integrity": "every file matches its recorded sha256",
                "card": card,
            }
        )
        return
    click.echo(
        f"would upload to {repo} ({'private' if private else 'public'}, revision {revision or 'main'}); "
        f"{len(files)} files match the sha256 recorded at conversion:"
    )
    for f in files:
        click.echo(f"  {f['bytes'] / 1e6:10.2f} MB  {f['path']}")
    click.echo(f"  {sum(f['bytes'] for f in files) / 1e6:10.2f} MB  total\n\n--- README.md (model card) ---\n{card}")


COMMANDS = [publish_cmd]
