"""The files API: thin views over files_app.services. A cluster the user may not see is a 404;
what the cluster's OS refuses is a 403 ("permission denied by the cluster"), a missing path a
404, a taken name or a folder that is not empty a 409. Transfers are not here: they stream
outside Django (files_app/transfers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.contrib.auth.models import User
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import APIException, NotFound
from rest_framework.exceptions import PermissionDenied as Forbidden
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.errors import ApiErrorsMixin
from core.api.responses import NOT_FOUND, ErrorSerializer
from core.errors import ParameterError
from core.transport.errors import CommandTimeout, SSHError
from core.transport.sftp import (
    FileError,
    FileExists,
    NoSuchFile,
    NotAFile,
    NotEmpty,
    PermissionDenied,
    SFTPSession,
)
from files_app import paths, services
from files_app.api.serializers import (
    DeleteSerializer,
    EntrySerializer,
    ListingSerializer,
    PathSerializer,
    RenameSerializer,
    RootSerializer,
)

ERRORS = {**NOT_FOUND, 400: ErrorSerializer, 403: ErrorSerializer, 409: ErrorSerializer}
PATH_PARAMETERS = [
    OpenApiParameter("path", str, description="A UTF-8 path (default: the home)."),
    OpenApiParameter("path_b64", str, description="The path's raw bytes, urlsafe base64."),
]


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "That name is taken."


class ClusterUnreachable(APIException):
    status_code = status.HTTP_502_BAD_GATEWAY
    default_detail = "The cluster cannot be reached."


class ClusterBusy(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "Every channel to the cluster is busy; try again."


def _body(request: Request) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise ParameterError("path", "send a JSON object")
    return request.data


def _user(request: Request) -> User:
    assert isinstance(request.user, User)
    return request.user


@contextmanager
def answering() -> Iterator[None]:
    """The cluster's refusals as the API's answers."""
    try:
        yield
    except services.ClusterNotFound:
        raise NotFound() from None
    except NoSuchFile as exc:
        raise NotFound(str(exc)) from None
    except PermissionDenied as exc:
        raise Forbidden(str(exc)) from None
    except (FileExists, NotEmpty) as exc:
        raise Conflict(str(exc)) from None
    except (NotAFile, FileError) as exc:
        raise ParameterError("path", str(exc)) from None
    except CommandTimeout as exc:
        raise ClusterBusy(str(exc)) from None
    except SSHError as exc:
        raise ClusterUnreachable(f"The cluster cannot be reached: {exc}") from None


@contextmanager
def cluster_files(request: Request, cluster: str) -> Iterator[tuple[services.Place, SFTPSession]]:
    with answering():
        place = services.place_for(_user(request), cluster)
        with services.open_files(place) as files:
            yield place, files


class FilesView(ApiErrorsMixin, APIView):
    parser_classes = [JSONParser]


class RootsView(FilesView):
    @extend_schema(
        operation_id="files_roots",
        description="Where to start: your home (`~`), then the folders the operator lists.",
        responses={200: RootSerializer(many=True), **ERRORS},
    )
    def get(self, request: Request, cluster: str) -> Response:
        with cluster_files(request, cluster) as (place, files):
            return Response(services.roots(place, files))


class ListingView(FilesView):
    @extend_schema(
        operation_id="files_list",
        description="A folder's entries as your Unix account sees them: folders first, then by "
        "name.",
        parameters=PATH_PARAMETERS,
        responses={200: ListingSerializer, **ERRORS},
    )
    def get(self, request: Request, cluster: str) -> Response:
        path = paths.path_from(request.query_params, required=False) or b"~"
        with cluster_files(request, cluster) as (_, files):
            return Response(services.listing(files, path))


class MkdirView(FilesView):
    @extend_schema(
        operation_id="files_mkdir",
        request=PathSerializer,
        responses={201: EntrySerializer, **ERRORS},
    )
    def post(self, request: Request, cluster: str) -> Response:
        path = paths.path_from(_body(request))
        with cluster_files(request, cluster) as (_, files):
            made = services.make_folder(files, path)
        return Response(made, status=status.HTTP_201_CREATED)


class RenameView(FilesView):
    @extend_schema(
        operation_id="files_rename",
        description="Rename or move; never over an existing name (409).",
        request=RenameSerializer,
        responses={200: EntrySerializer, **ERRORS},
    )
    def post(self, request: Request, cluster: str) -> Response:
        source = paths.path_from(_body(request), "from")
        target = paths.path_from(_body(request), "to")
        with cluster_files(request, cluster) as (_, files):
            return Response(services.rename(files, source, target))


class DeleteView(FilesView):
    @extend_schema(
        operation_id="files_delete",
        description="A file or a link (never what it points to); a folder if empty, or with "
        "`recursive` all it holds.",
        request=DeleteSerializer,
        responses={204: None, **ERRORS},
    )
    def post(self, request: Request, cluster: str) -> Response:
        path = paths.path_from(_body(request))
        recursive = _body(request).get("recursive", False)
        if not isinstance(recursive, bool):
            raise ParameterError("recursive", "must be true or false")
        with cluster_files(request, cluster) as (_, files):
            services.delete(files, path, recursive=recursive)
        return Response(status=status.HTTP_204_NO_CONTENT)
