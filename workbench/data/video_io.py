"""Video files for datasets through PyAV: decode the frames at given times (seeking), encode H.264.

Decoding seeks to the key frame before the first wanted time and decodes forward only until the
last one, so serving a 16-frame window reads a few group-of-pictures, never the whole file.
"""

from __future__ import annotations

import contextlib
import fractions
import os
from pathlib import Path
from typing import Any

import numpy as np

from workbench.errors import DataError

#: Video files one process keeps open at most.
MAX_OPEN = 32
FIX = "re-download or re-export the dataset"


class VideoReader:
    """Open video files of one process, each kept open between reads (reopened after a fork)."""

    def __init__(self) -> None:
        self._open: dict[Path, Any] = {}
        self._pid: int | None = None
        self.decoded = 0  # frames decoded by this process so far (seeking keeps it near the frames served)

    def _container(self, path: Path, what: str = "") -> Any:
        from workbench.extras import require

        require("data", what="reading LeRobot videos", modules=("av",))
        import av

        if self._pid != os.getpid():  # a forked DataLoader worker opens its own files
            self._open, self._pid = {}, os.getpid()
        container = self._open.get(path)
        if container is None:
            if not path.is_file():
                raise DataError(f"{path} is missing (a camera's video file of the LeRobot layout{what}). "
                                f"The dataset is incomplete; {FIX}.")
            container = None
            try:
                container = av.open(str(path))
                if not container.streams.video:
                    raise DataError(f"{path} holds no video stream{what}; "
                                    f"expected an MP4 with one video stream.")
                # One decoding thread: parallelism comes from DataLoader workers, and a decoder with a
                # thread pool that is torn down in a forked worker (the garbage collector freeing an
                # inherited container) waits forever on its threads' condition variables.
                codec = container.streams.video[0].codec_context
                if codec is None:  # a stream whose codec parameters were lost (a truncated or damaged header)
                    raise ValueError("the video stream has no decoder parameters")
                codec.thread_count, codec.thread_type = 1, "NONE"
            except Exception as err:  # PyAV's FFmpeg errors, EOFError, ValueError: a damaged container
                if container is not None:
                    with contextlib.suppress(Exception):
                        container.close()
                if isinstance(err, DataError):
                    raise
                raise DataError(f"{path}: not a readable video{what} ({type(err).__name__}: {err}). "
                                f"The MP4 is corrupt or truncated; {FIX}.") from None
            if len(self._open) >= MAX_OPEN:  # per-episode layouts have thousands of files: close the oldest
                self._forget(next(iter(self._open)))
            self._open[path] = container
        return container

    def frames(self, path: Path, times: np.ndarray, size: tuple[int, int] | None, tolerance: float,
               what: str = "") -> np.ndarray:
        """uint8 ``(len(times), H, W, 3)``: for each time (seconds in the file), the nearest decoded frame.

        ``size`` = (H, W) resizes (area averaging); ``None`` keeps the stored size. A time with no
        frame within ``tolerance`` seconds, a frame the decoder flags as corrupt (it concealed
        damaged data) and a decoding failure are errors naming the file; ``what`` (e.g. ``", episode
        3"``) is added to their messages.
        """
        container = self._container(path, what)
        stream = container.streams.video[0]
        first, last = float(times.min()), float(times.max())
        found_t: list[float] = []
        found: list[np.ndarray] = []
        kwargs = {"format": "rgb24"}
        if size is not None:
            kwargs.update(height=int(size[0]), width=int(size[1]), interpolation="AREA")
        try:
            container.seek(max(0, int((first - tolerance) / stream.time_base)), stream=stream, backward=True)
            for frame in container.decode(stream):
                self.decoded += 1
                t = float(frame.time)
                if t < first - tolerance:
                    continue
                if t > last + tolerance:
                    break
                if frame.is_corrupt:
                    raise DataError(f"{path}: the frame at t={t:.3f}s{what} is corrupt "
                                    f"(the decoder had to conceal damaged data). The MP4 is damaged; {FIX}.")
                found_t.append(t)
                found.append(frame.to_ndarray(**kwargs))
        except DataError:
            self._forget(path)
            raise
        except Exception as err:  # PyAV's FFmpeg errors, EOFError, ValueError, OverflowError: damaged data
            self._forget(path)
            raise DataError(f"{path}: decoding failed near t={first:.3f}s{what} "
                            f"({type(err).__name__}: {err}). "
                            f"The MP4 is corrupt or truncated; {FIX}.") from None
        if not found:
            raise DataError(f"{path}: no frame decoded between t={first:.3f}s and t={last:.3f}s{what} "
                            f"(the file ends earlier: truncated, "
                            f"or the episode metadata does not match the video). "
                            f"Re-download or re-export the dataset.")
        have = np.asarray(found_t)
        nearest = np.abs(have[None, :] - times[:, None]).argmin(axis=1)
        miss = np.abs(have[nearest] - times) > tolerance
        if miss.any():
            raise DataError(f"{path}: no frame within {tolerance:.4f}s "
                            f"of t={float(times[miss][0]):.4f}s{what} "
                            f"(decoded {have.min():.4f}..{have.max():.4f}s). The video is truncated "
                            f"or its timestamps do not match the parquet 'timestamp' column; "
                            f"re-download or re-export the dataset.")
        return np.stack([found[i] for i in nearest])

    def _forget(self, path: Path) -> None:
        container = self._open.pop(path, None)
        # closing a container of damaged data may fail too; it is dropped either way
        if container is not None:
            with contextlib.suppress(Exception):
                container.close()

    def close(self) -> None:
        for path in list(self._open):
            self._forget(path)
        self._open = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"_open": {}, "_pid": None, "decoded": 0}


def video_info(path: Path) -> dict[str, Any]:
    """The ``info`` block LeRobot keeps per video feature in ``meta/info.json`` (with ``is_depth_map``, the
    key lerobot 0.6 writes and reads)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return {"video.height": stream.height, "video.width": stream.width,
                "video.codec": stream.codec_context.name, "video.pix_fmt": stream.pix_fmt,
                "video.fps": _number(stream.average_rate), "video.channels": 3,
                "has_audio": bool(container.streams.audio), "is_depth_map": False}


def _number(rate: Any) -> float | int:
    value = float(rate or 0)
    return int(value) if value.is_integer() else value


class H264Writer:
    """Frames → an H.264 MP4 (yuv420p), frame ``i`` at time ``i / fps``, a key frame every ``gop`` frames."""

    def __init__(self, path: Path, fps: float, height: int, width: int, crf: int = 18, gop: int = 8):
        import av

        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.rate = fractions.Fraction(fps).limit_denominator(1001)
        self.container = av.open(str(path), "w")
        stream = self.container.add_stream("libx264", rate=self.rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size = gop
        stream.codec_context.max_b_frames = 0
        stream.codec_context.time_base = 1 / self.rate
        stream.options = {"crf": str(crf), "preset": "medium"}
        self.stream, self.count = stream, 0

    def write(self, frames: np.ndarray) -> None:
        import av

        for image in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts, frame.time_base = self.count, 1 / self.rate
            self.count += 1
            for packet in self.stream.encode(frame):
                self.container.mux(packet)

    def close(self) -> None:
        for packet in self.stream.encode():
            self.container.mux(packet)
        self.container.close()
