"""A plain FastAPI app under uvicorn (one process, no batching of its own): the baseline a user writes by hand.

Usage: <fastapi venv>/bin/python fastapi_server.py PORT
Routes: POST /identity {"data": [16 floats]} -> {"data": [...]}; POST /predict {"features": [16 floats]} -> {"label": n}
"""

from __future__ import annotations

import sys

import numpy as np
import uvicorn
from common import build_model
from fastapi import FastAPI
from pydantic import BaseModel


class Data(BaseModel):
    data: list[float]


class Features(BaseModel):
    features: list[float]


app = FastAPI()
MODEL = build_model()


@app.post("/identity")
async def identity(item: Data) -> dict[str, list[float]]:
    return {"data": item.data}


@app.post("/predict")
async def predict(item: Features) -> dict[str, int]:
    return {"label": int(MODEL.predict(np.asarray([item.features], dtype=np.float32))[0])}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
