"""The ``images`` group: the image registry bare metal and VPS boot from (kernels, initrds, disk images)."""

from bettercompute.modules.images._methods import ACTIONS as ACTIONS
from bettercompute.modules.images._methods import ImagesGroup as ImagesGroup
from bettercompute.modules.images._module import ImagesModule as ImagesModule
from bettercompute.modules.images._port import IMAGES as IMAGES
from bettercompute.modules.images._port import ImageRecord as ImageRecord
from bettercompute.modules.images._port import Images as Images
from bettercompute.modules.images._schemas import MAX_CMDLINE as MAX_CMDLINE
from bettercompute.modules.images._schemas import MAX_PROVIDER_IMAGES as MAX_PROVIDER_IMAGES
from bettercompute.modules.images._schemas import DiskFormat as DiskFormat
from bettercompute.modules.images._schemas import GetImageInput as GetImageInput
from bettercompute.modules.images._schemas import Image as Image
from bettercompute.modules.images._schemas import ImageKind as ImageKind
from bettercompute.modules.images._schemas import ListImagesInput as ListImagesInput
from bettercompute.modules.images._schemas import ListImagesOutput as ListImagesOutput
from bettercompute.modules.images._schemas import RegisterImageInput as RegisterImageInput
from bettercompute.modules.images._schemas import url_problem as url_problem
from bettercompute.modules.images._service import IMAGE as IMAGE
from bettercompute.modules.images._service import image_view as image_view

__all__ = [
    "ACTIONS",
    "IMAGE",
    "IMAGES",
    "MAX_CMDLINE",
    "MAX_PROVIDER_IMAGES",
    "DiskFormat",
    "GetImageInput",
    "Image",
    "ImageKind",
    "ImageRecord",
    "Images",
    "ImagesGroup",
    "ImagesModule",
    "ListImagesInput",
    "ListImagesOutput",
    "RegisterImageInput",
    "image_view",
    "url_problem",
]
