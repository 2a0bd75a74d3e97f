"""The Files page as a person uses it: Debian's headless Chromium against the whole platform as
real processes, browsing the test cluster (this machine's sshd) over SFTP as each user's own
Unix account, pwalice and pwbob, whose homes are 0700.

Screenshots go to data/screenshots/files/; look at them.
"""

from __future__ import annotations

import base64
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from files_app.models import FileRoot
from harness import REPO
from harness.platform import Platform
from harness.waiting import wait_for
from tests.browser import launched_chromium, logged_in_page
from tests.files import places
from tests.files.places import CLUSTER, owned_by
from tests.platforms import module_platform
from workers_app.models import Cluster

pytestmark = [pytest.mark.slurm, pytest.mark.live]

SCREENSHOTS = REPO / "data" / "screenshots" / "files"
# A name a shell would trip over: a leading dash, spaces, both quotes.
ODD_NAME = "-rf 'my data' \"v2\".txt"
RENAMED = "renamed - 'it' \"is\" here.txt"
# Fixtures, found by pytest under these names.
people = places.people
workspace = places.workspace
# Small enough to pass in a test; the two-gigabyte streams are test_transfer_memory.py's.
UPLOAD_LIMIT = 1_000_000
shared_files_platform = module_platform(knobs={"ACTIVATE_FILES_MAX_UPLOAD": str(UPLOAD_LIMIT)})


@pytest.fixture
def files_platform(transactional_db: None, shared_files_platform: Platform) -> Platform:
    return shared_files_platform


def browser_of(chromium: Any, platform: Platform, name: str) -> Any:
    return logged_in_page(chromium, platform.url, name, f"pw-{name}-123")


@pytest.fixture
def chromium() -> Iterator[Any]:
    with launched_chromium() as browser:
        yield browser


def shot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def b64(path: bytes) -> str:
    return base64.urlsafe_b64encode(path).decode()


def files_url(platform: Platform, path: bytes | None = None) -> str:
    url = f"{platform.url}/clusters/{CLUSTER}/files/"
    return url if path is None else f"{url}?path_b64={b64(path).replace('=', '%3D')}"


def row(page: Any, name: str) -> Any:
    """The listing's row whose name is exactly ``name``."""
    return page.locator("#files-body tr").filter(
        has=page.locator(".entry-name").get_by_text(name, exact=True)
    )


def entry_menu(page: Any, name: str, item: str) -> None:
    row(page, name).locator("details.menu summary").click()
    row(page, name).get_by_role("button", name=item).click()


def drop_file(page: Any, where: str, name: str, content: bytes) -> None:
    """What a drag from the desktop delivers to the element ``where`` names: dragenter and
    dragover (the listing says where the file would go), then the drop, with the file."""
    marked = page.evaluate(
        """([where, name, data]) => {
            const bytes = Uint8Array.from(atob(data), c => c.charCodeAt(0));
            const transfer = new DataTransfer();
            transfer.items.add(new File([bytes], name));
            const target = document.querySelector(where);
            const fire = type => target.dispatchEvent(new DragEvent(type, {
                dataTransfer: transfer, bubbles: true, cancelable: true,
            }));
            fire("dragenter");
            fire("dragover");
            const marked = document.getElementById("files-drop").classList.contains("dragging");
            fire("drop");
            return marked;
        }""",
        [where, name, base64.b64encode(content).decode()],
    )
    assert marked, "the listing did not show it takes the drop"


def uploaded(page: Any, name: str) -> Any:
    item = page.locator("li.upload").filter(
        has=page.locator(".upload-name").get_by_text(name, exact=True)
    )
    return item.last


def test_alice_uploads_downloads_renames_and_deletes_her_files(
    files_platform: Platform,
    people: dict[str, User],
    chromium: Any,
    workspace: Path,
    tmp_path: Path,
) -> None:
    FileRoot.objects.create(cluster=Cluster.objects.get(name=CLUSTER), label="Scratch", path="/tmp")
    page = browser_of(chromium, files_platform, "alice")
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"{e}\n{e.stack}"))

    # Given: from the Clusters page, the cluster's Files open on her home folder.
    page.goto(f"{files_platform.url}/clusters/")
    shot(page, "00-clusters")
    page.locator(f"#cluster-{CLUSTER}").get_by_role("link", name="Files").click()
    page.wait_for_url(files_url(files_platform))
    expect(page.locator("#files-here")).to_have_text("pwalice")
    expect(page.locator("#files-listing .places a[aria-current]")).to_have_text("Home")
    expect(row(page, ".bashrc")).to_be_hidden()  # hidden files stay out of the way
    shot(page, "01-home")
    places_ = page.locator("#files-listing .places")
    places_.get_by_role("link", name="Scratch").click()  # the operator's place, and back
    expect(page.locator("#files-here")).to_have_text("tmp")
    expect(places_.locator("a[aria-current]")).to_have_text("Scratch")
    places_.get_by_role("link", name="Home").click()
    expect(page.locator("#files-here")).to_have_text("pwalice")

    # When she enters her folder (the keyboard's way), and makes a folder in it.
    row(page, workspace.name).get_by_role("link", name=workspace.name).press("Enter")
    expect(page.locator("#files-here")).to_have_text(workspace.name)
    expect(page.locator("#files-here")).to_be_focused()
    assert page.url == files_url(files_platform, os.fsencode(workspace))
    expect(page.locator("#files-body")).to_contain_text("This folder is empty")
    page.go_back()  # the browser's Back and Forward follow
    expect(page.locator("#files-here")).to_have_text("pwalice")
    page.go_forward()
    expect(page.locator("#files-here")).to_have_text(workspace.name)
    stored = page.evaluate("() => JSON.stringify(Object.entries(sessionStorage))")
    assert "htmx-history-cache" not in stored  # htmx keeps no copy of a listing
    page.get_by_role("button", name="New folder").click()
    page.get_by_role("textbox", name="Name").fill("results 2026")
    page.get_by_role("button", name="Create folder").click()
    expect(row(page, "results 2026")).to_have_count(1)
    assert (workspace / "results 2026").is_dir()
    page.get_by_role("button", name="New folder").click()  # the same name again: said, kept open
    page.get_by_role("textbox", name="Name").fill("results 2026")
    page.get_by_role("button", name="Create folder").click()
    expect(page.locator("#files-dialog-error")).to_have_text(
        "That name is taken here: choose another."
    )
    page.get_by_role("textbox", name="Name").fill("a/b")
    page.get_by_role("button", name="Create folder").click()
    expect(page.locator("#files-dialog-error")).to_have_text("A name cannot hold a slash (/).")
    page.keyboard.press("Escape")
    expect(page.locator("#files-dialog")).to_be_hidden()
    assert (workspace / "results 2026").stat().st_uid == workspace.stat().st_uid

    # ...uploads a file with the picker, drops another on the listing and a third on the
    # folder's row.
    picked = secrets.token_bytes(300_000)
    dropped = secrets.token_bytes(70_000) + b"\x00\r\n end"
    source = tmp_path / ODD_NAME
    source.write_bytes(picked)
    page.set_input_files("#files-input", str(source))
    expect(uploaded(page, ODD_NAME).locator(".upload-status")).to_have_text("Uploaded")
    drop_file(page, "#files-listing thead", "dropped data.bin", dropped)
    expect(uploaded(page, "dropped data.bin").locator(".upload-status")).to_have_text("Uploaded")
    drop_file(page, "#files-body tr[data-name='results 2026']", "into folder.txt", b"inside")
    expect(uploaded(page, "into folder.txt").locator(".upload-status")).to_have_text("Uploaded")
    shot(page, "02-uploaded")

    # Then each is listed, and on the cluster byte for byte, owned by pwalice.
    expect(row(page, ODD_NAME)).to_have_count(1)
    expect(row(page, "dropped data.bin")).to_have_count(1)
    expect(row(page, ODD_NAME).locator("td.num")).to_have_text("293 KiB")
    assert (workspace / ODD_NAME).read_bytes() == picked
    assert (workspace / "dropped data.bin").read_bytes() == dropped
    assert (workspace / "results 2026" / "into folder.txt").read_bytes() == b"inside"
    assert (workspace / ODD_NAME).stat().st_uid == workspace.stat().st_uid

    # When the same name is uploaded again, the page says it is there and offers to replace it.
    source.write_bytes(picked[::-1])
    page.set_input_files("#files-input", str(source))
    again = uploaded(page, ODD_NAME)
    expect(again.locator(".upload-status")).to_contain_text("already in")
    shot(page, "03-exists")
    again.get_by_role("button", name=f"Replace {ODD_NAME}").click()
    expect(again.locator(".upload-status")).to_have_text("Uploaded")
    assert (workspace / ODD_NAME).read_bytes() == picked[::-1]

    # ...and one over the operator's limit is refused, the limit said.
    big = tmp_path / "too big.bin"
    big.write_bytes(b"\0" * (UPLOAD_LIMIT + 1))
    page.set_input_files("#files-input", str(big))
    expect(uploaded(page, "too big.bin").locator(".upload-status")).to_contain_text(
        f"Too large. The file is larger than this platform takes: at most {UPLOAD_LIMIT:,} bytes"
    )
    expect(uploaded(page, "too big.bin").get_by_role("button")).to_have_count(0)  # no retry
    assert not (workspace / "too big.bin").exists()
    shot(page, "04-too-large")

    # When she downloads them back: the same bytes.
    with page.expect_download() as download:
        row(page, ODD_NAME).get_by_role("link", name=f"Download {ODD_NAME}").click()
    # (Chromium may swap characters it keeps out of file names, the quotes among them.)
    assert "my data" in download.value.suggested_filename, download.value.suggested_filename
    assert Path(download.value.path()).read_bytes() == picked[::-1]
    with page.expect_download() as download:
        row(page, "dropped data.bin").get_by_role(
            "link", name="dropped data.bin", exact=True
        ).click()
    assert Path(download.value.path()).read_bytes() == dropped

    # When she renames one in the dialog.
    entry_menu(page, ODD_NAME, "Rename…")
    expect(page.get_by_role("textbox", name="Name")).to_have_value(ODD_NAME)
    page.get_by_role("textbox", name="Name").fill(RENAMED)
    shot(page, "05-rename")
    page.get_by_role("button", name="Rename", exact=True).click()
    expect(row(page, RENAMED)).to_have_count(1)
    expect(row(page, ODD_NAME)).to_have_count(0)
    assert (workspace / RENAMED).read_bytes() == picked[::-1]
    assert not (workspace / ODD_NAME).exists()

    # ...and deletes it, confirming.
    entry_menu(page, RENAMED, "Delete…")
    expect(page.locator("#files-dialog")).to_contain_text("cannot be undone")
    expect(page.get_by_role("textbox", name="Name")).to_be_hidden()
    page.get_by_role("button", name="Delete file").click()
    expect(row(page, RENAMED)).to_have_count(0)
    assert not (workspace / RENAMED).exists()

    # Names that are no text a browser types: a newline in one, bytes that are no UTF-8 in
    # another, made on the cluster beside the page; both list, download and delete.
    for name, content in ((b"two\nlines.txt", b"first"), (b"caf\xe9-latin1.txt", b"second")):
        path = Path(os.fsdecode(os.fsencode(workspace) + b"/" + name))
        path.write_bytes(content)
        owned_by(path)
    page.get_by_role("button", name="Refresh").click()
    latin = page.locator("#files-body tr").filter(has_text="-latin1.txt")
    newline = page.locator("#files-body tr").filter(has_text="lines.txt")
    expect(latin.locator(".entry-name")).to_have_text("caf\ufffd-latin1.txt")
    expect(newline.locator(".entry-name")).to_have_text("two\u21b5lines.txt")
    with page.expect_download() as download:
        latin.get_by_role("link", name="Download").click()
    assert Path(download.value.path()).read_bytes() == b"second"
    with page.expect_download() as download:
        newline.get_by_role("link", name="Download").click()
    assert Path(download.value.path()).read_bytes() == b"first"
    shot(page, "06-strange-names")
    page.set_viewport_size({"width": 390, "height": 844})  # a phone: rows become cards
    shot(page, "06b-phone")
    page.set_viewport_size({"width": 1280, "height": 860})
    newline.locator("details.menu summary").click()
    newline.get_by_role("button", name="Delete…").click()
    page.get_by_role("button", name="Delete file").click()
    expect(newline).to_have_count(0)
    assert not Path(os.fsdecode(os.fsencode(workspace) + b"/two\nlines.txt")).exists()

    # When she goes up by the path and deletes the whole folder: the dialog counts what goes.
    page.locator("#files-listing .crumbs").get_by_role("link", name="pwalice").click()
    expect(page.locator("#files-here")).to_have_text("pwalice")
    entry_menu(page, workspace.name, "Delete…")
    expect(page.locator("#files-dialog-text")).to_contain_text(
        "It holds 3 items, 1 of them a folder"
    )
    shot(page, "07-delete-folder")
    page.get_by_role("button", name="Delete folder").click()
    expect(row(page, workspace.name)).to_have_count(0)
    assert not workspace.exists()
    assert errors == []


def test_a_user_outside_the_clusters_groups_gets_404_on_the_page_and_the_api(
    files_platform: Platform, people: dict[str, User], chromium: Any
) -> None:
    page = browser_of(chromium, files_platform, "carol")
    answer = page.goto(files_url(files_platform, b"/home/pwalice"))
    assert answer is not None and answer.status == 404
    api = f"{files_platform.url}/api/clusters/{CLUSTER}/files/"
    assert page.request.get(f"{api}?path_b64={b64(b'/home/pwalice')}").status == 404
    assert page.request.get(f"{api}roots/").status == 404
    download = f"{files_platform.url}/files/{CLUSTER}/download"
    assert page.request.get(f"{download}?path_b64={b64(b'/home/pwalice/.bashrc')}").status == 404


def test_the_neighbours_account_cannot_read_the_owners_0700_home_through_the_page(
    files_platform: Platform, people: dict[str, User], chromium: Any
) -> None:
    # Given: pwalice's home is hers alone.
    assert Path("/home/pwalice").stat().st_mode & 0o777 == 0o700
    page = browser_of(chromium, files_platform, "bob")

    # When bob, as pwbob, opens her home on the Files page.
    page.goto(files_url(files_platform, b"/home/pwalice"))

    # Then the page says permission denied, and shows nothing of hers.
    expect(page.locator("#files-problem")).to_contain_text(
        "Permission denied: the cluster does not let your account read /home/pwalice."
    )
    expect(page.locator("#files-here")).to_have_text("pwalice")
    expect(page.locator("#files-body")).not_to_contain_text(".bashrc")
    expect(page.get_by_role("button", name="Upload files")).to_be_disabled()
    shot(page, "08-neighbour-denied")
    api = f"{files_platform.url}/api/clusters/{CLUSTER}/files/"
    assert page.request.get(f"{api}?path_b64={b64(b'/home/pwalice')}").status == 403
    download = f"{files_platform.url}/files/{CLUSTER}/download"
    assert page.request.get(f"{download}?path_b64={b64(b'/home/pwalice/.bashrc')}").status == 403

    # ...while his own home lists as usual.
    page.locator("#files-listing .places").get_by_role("link", name="Home").click()
    expect(page.locator("#files-here")).to_have_text("pwbob")
    expect(page.locator("#files-problem")).to_have_count(0)


def test_an_upload_shows_its_progress_and_cancelling_it_leaves_nothing(
    files_platform: Platform,
    people: dict[str, User],
    chromium: Any,
    workspace: Path,
    tmp_path: Path,
) -> None:
    page = browser_of(chromium, files_platform, "alice")
    page.goto(files_url(files_platform, os.fsencode(workspace)))
    # The browser sends at 64 KB/s: the upload is seen under way.
    network = page.context.new_cdp_session(page)
    network.send("Network.enable")
    network.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": 64_000},
    )
    source = tmp_path / "slow upload.bin"
    source.write_bytes(secrets.token_bytes(UPLOAD_LIMIT - 1000))

    page.set_input_files("#files-input", str(source))
    upload = uploaded(page, "slow upload.bin")
    expect(upload.locator(".upload-status")).to_contain_text("% · ", timeout=15_000)
    progress = float(upload.locator("progress").evaluate("bar => bar.value"))
    assert 0 < progress < 100, progress
    shot(page, "09-uploading")
    upload.get_by_role("button", name="Cancel the upload of slow upload.bin").click()

    expect(upload.locator(".upload-status")).to_have_text(
        "Cancelled: nothing was saved under its name."
    )
    page.get_by_role("button", name="Refresh").click()
    expect(row(page, "slow upload.bin")).to_have_count(0)
    assert not (workspace / "slow upload.bin").exists()
    # The hidden file it was being written to goes too, once the platform sees it cut.
    wait_for(lambda: not any(workspace.iterdir()), timeout=20)
